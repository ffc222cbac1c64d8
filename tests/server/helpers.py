"""Small helpers shared by the server tests."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from engine.client.connect import ws_connect

GREEDY = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}  # random weights may say EOS


def http_get(port: int, path: str, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(port: int, name: str) -> float:
    """The value of ``name``'s one series in /metrics (every series carries labels)."""
    text = http_get(port, "/metrics")[1]
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
    return float(line.split()[-1])


def healthz(port: int) -> dict:
    return json.loads(http_get(port, "/healthz")[1])


def raw(url: str, **kw):
    """A bare websocket (no client logic) that has read hello and snapshot."""
    kw.setdefault("close_timeout", 1)  # an unread backlog pauses the reader; do not wait 10 s on close
    ws = ws_connect(url, compression=None, max_size=None, **kw)
    assert json.loads(ws.recv(timeout=10))["type"] == "hello"
    assert json.loads(ws.recv(timeout=10))["type"] == "snapshot"
    return ws


def recv_until(ws, pred, timeout: float = 20.0) -> tuple[dict, list[dict]]:
    """Read until ``pred(msg)``; returns (that message, the ones before it)."""
    seen, deadline = [], time.monotonic() + timeout
    while True:
        msg = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if pred(msg):
            return msg, seen
        seen.append(msg)


def send(ws, **op) -> None:
    ws.send(json.dumps(op))
