"""The soak's clients (``bench.soak``): the good clients, which time their own requests,
and the hostile kinds, which run in a process of their own (``hostile_clients``).

Each loop is bounded: it stops when ``stop`` is set, and every socket operation has a
timeout. They only ever connect to the soak's own server on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

GREEDY = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True}


@dataclass
class Tally:
    """What every client thread adds to (under one lock)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: set[str] = field(default_factory=set)  # every request id any client got accepted
    good_latency: dict[str, list[float]] = field(default_factory=lambda: {"quiet": [], "mixed": []})
    good_failures: list[str] = field(default_factory=list)
    hostile_ops: int = 0
    hostile_errors: dict[str, int] = field(default_factory=dict)
    closes: int = 0

    def error(self, code: str) -> None:
        with self.lock:
            self.hostile_errors[code] = self.hostile_errors.get(code, 0) + 1


def good_client(url: str, tally: Tally, phase: list[str], stop: threading.Event, k: int) -> None:
    from engine.client import KVScopeClient

    i = 0
    with KVScopeClient(url, timeout=120) as c:
        while not stop.is_set():
            i += 1
            rid = f"good{k}-{i}"
            t0 = time.monotonic()
            try:
                fin = c.generate(f"good client {k} asks question {i % 50}", params=GREEDY, request_id=rid)
            except Exception as exc:  # counted, never fatal: the soak reports it
                with tally.lock:
                    tally.good_failures.append(f"{rid}: {exc}")
                continue
            dt = time.monotonic() - t0
            with tally.lock:
                tally.accepted.add(rid)
                if fin.outputs[0]["finish_reason"] != "length":
                    tally.good_failures.append(f"{rid}: {fin.outputs[0]['finish_reason']}")
                tally.good_latency[phase[0]].append(dt)


def _raw(url: str, rcvbuf: int | None = None):
    from engine.client.connect import ws_connect

    sock = None
    if rcvbuf is not None:
        u = urllib.parse.urlsplit(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.connect((u.hostname, u.port))
    return ws_connect(url, sock=sock, compression=None, max_size=None, close_timeout=1,
                      open_timeout=30, max_queue=1 if rcvbuf else 16)


def _drain_codes(ws, tally: Tally, until_rid: str | None = None, timeout: float = 30.0) -> None:
    """Read a connection's messages, counting error codes, until ``until_rid`` is answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic())))
        except TimeoutError:
            return
        if m["type"] == "error":
            tally.error(m["code"])
        elif m["type"] == "accepted":
            with tally.lock:
                tally.accepted.add(m["request_id"])
        if until_rid is not None and m.get("request_id") == until_rid and m["type"] in ("error", "finished"):
            return


def stalled_reader(url: str, tally: Tally, stop: threading.Event) -> None:
    """Never reads; asks for 100 snapshots and floods pings until the server closes it."""
    while not stop.is_set():
        try:
            ws = _raw(url, rcvbuf=4096)
            for _ in range(100):
                ws.send('{"type":"snapshot"}')
            for _ in range(20_000):
                if stop.is_set():
                    break
                ws.send('{"type":"ping"}')
            with tally.lock:
                tally.hostile_ops += 20_100
            stop.wait(5)
            ws.close()
        except Exception:  # closed by the server (slow_client): what it is for
            with tally.lock:
                tally.closes += 1
            stop.wait(1)


BAD_FRAMES = [
    "not json", "[" * 50_000 + "]" * 50_000, '{"type":"frobnicate"}', "[1,2]",
    '{"type":"submit","prompt":"hi","params":{"temperature":1,"seed":18446744073709551616,"max_tokens":4}}',
    json.dumps({"type": "submit", "prompt": "hi", "params": {"temperature": 1, "top_k": 2**63}}),
    json.dumps({"type": "submit", "prompt": "hi", "params": {"stop": {"a": 1}}}),
    json.dumps({"type": "submit", "messages": [{"role": "robot", "content": "x"}]}),
    json.dumps({"type": "submit", "prompt": "x" * 900_000}),
    json.dumps({"type": "submit", "prompt": [1, 10**9]}),
    json.dumps({"type": "restart", "engine": {"num_kv_blocks": None}}),
    json.dumps({"type": "abort", "request_id": "not-mine"}),
    json.dumps({"type": "submit", "prompt": "hi", "request_id": "x\ud800"}),
]


def bad_framer(url: str, tally: Tally, stop: threading.Event) -> None:
    """Every malformed or out-of-range frame, in turn, reading each answer."""
    i = 0
    while not stop.is_set():
        try:
            with _raw(url) as ws:
                for _ in range(50):
                    if stop.is_set():
                        break
                    ws.send(BAD_FRAMES[i % len(BAD_FRAMES)])
                    i += 1
                    _drain_codes(ws, tally, timeout=0.5)
                    with tally.lock:
                        tally.hostile_ops += 1
        except Exception:
            stop.wait(1)


def flooder(url: str, tally: Tally, stop: threading.Event, k: int) -> None:
    """Submits up to (and past) the in-flight cap, then vanishes: its requests are aborted."""
    n = 0
    while not stop.is_set():
        try:
            ws = _raw(url)
            for j in range(80):
                n += 1
                ws.send(json.dumps({"type": "submit", "prompt": f"flood {k} {j} " * 8,
                                    "params": {"temperature": 0.8, "max_tokens": 32, "seed": n},
                                    "request_id": f"flood{k}-{n}"}))
            _drain_codes(ws, tally, timeout=0.5)
            with tally.lock:
                tally.hostile_ops += 80
            ws.close()
        except Exception:
            pass
        stop.wait(3)


def churner(url: str, tally: Tally, stop: threading.Event) -> None:
    """Connects, reads hello and snapshot, leaves; over and over."""
    while not stop.is_set():
        try:
            with _raw(url) as ws:
                ws.recv(timeout=10)
                ws.recv(timeout=10)
        except Exception:
            pass
        with tally.lock:
            tally.hostile_ops += 1
        stop.wait(0.2)


HOSTILE = ("stalled", "bad", "flood", "churn")
_KINDS = {"stalled": [(stalled_reader, ())], "bad": [(bad_framer, ())],
          "flood": [(flooder, (0,)), (flooder, (1,))], "churn": [(churner, ())]}


def hostile_clients(url: str, kinds: tuple[str, ...], seconds: float, out: str) -> None:
    """The hostile clients for ``seconds`` (a process of their own); what they saw goes
    to ``out`` as JSON for the run's report."""
    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=fn, args=(url, tally, stop, *a), daemon=True)
               for kind in kinds for fn, a in _KINDS[kind]]
    for t in threads:
        t.start()
    stop.wait(max(0.0, seconds))
    stop.set()
    for t in threads:
        t.join(60)
    with tally.lock, open(out, "w") as f:
        json.dump({"accepted": sorted(tally.accepted), "hostile_ops": tally.hostile_ops,
                   "hostile_errors": tally.hostile_errors, "closes": tally.closes}, f)
