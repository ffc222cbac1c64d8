"""A subscriber that never reads slows neither the engine nor other clients; the
server's queue for it stays bounded; when it reads again it sees a seq gap and
re-bases from a snapshot."""

import json
import socket
import time
import urllib.parse

from engine.client import KVScopeClient
from engine.client.connect import ws_connect
from tests.server.helpers import GREEDY, http_get

STEP_BUFFER = 8


def _stalled_socket(url: str):
    """A websocket whose kernel receive buffer is tiny and whose reader pauses after
    one frame: once the server's send buffers fill, nothing more gets through."""
    u = urllib.parse.urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: sets the window
    sock.connect((u.hostname, u.port))
    # no keepalive of its own: a reader that pauses never sees the server's pongs, and the
    # client's 20 s ping timeout would close it, not the server
    return ws_connect(url, sock=sock, max_queue=1, compression=None, max_size=None, close_timeout=1,
                      ping_interval=None)


def _drain(ws) -> list[dict]:
    msgs = []
    while True:
        try:
            msgs.append(json.loads(ws.recv(timeout=1.0)))
        except TimeoutError:
            return msgs


def _run(client: KVScopeClient, n: int) -> float:
    t0 = time.monotonic()
    for i in range(n):
        fin = client.generate(f"busy {i}", params={**GREEDY, "max_tokens": 12})
        assert fin.outputs[0]["finish_reason"] == "length"
    return time.monotonic() - t0


def test_stalled_reader_does_not_slow_others_and_stays_bounded(make_server):
    # A big pool makes the snapshot (~0.7 MB) more than the socket buffers hold (the
    # server caps its send buffer per connection at 256 KiB, the client reads 4 KiB).
    server = make_server(engine={"num_kv_blocks": 8192}, step_buffer=STEP_BUFFER)
    with KVScopeClient(server.url, timeout=30) as busy:
        baseline = _run(busy, 4)
        stalled = _stalled_socket(server.url)
        deadline = time.monotonic() + 10
        # Once its first snapshot is on the wire (out of the outbox), one more, for
        # margin: asked earlier, it would be coalesced into the unsent first one.
        while not any(c.attached and not c.outbox.num_snapshots
                      for c in server.hub.conns.values() if c.id != 1):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stalled.send(json.dumps({"type": "snapshot"}))
        with_stalled = _run(busy, 12)
        # per request, the stalled subscriber costs nothing noticeable
        assert with_stalled / 12 < 3 * baseline / 4 + 0.5, (baseline, with_stalled)
        # The stalled connection drops steps (on a loaded box the busy client, which reads
        # only while it generates, may drop some too); every outbox stays within its bound.
        conn = max(server.hub.conns.values(), key=lambda c: c.outbox.dropped_steps)
        assert conn.outbox.dropped_steps > 0
        for c in server.hub.conns.values():
            assert c.outbox.num_steps <= STEP_BUFFER and c.outbox.max_steps_seen <= STEP_BUFFER
        status, text = http_get(server.port, "/metrics")
        dropped = [line for line in text.splitlines()
                   if line.startswith("kvscope_ws_dropped_step_messages_total")]
        assert float(dropped[0].split()[-1]) > 0
        # The stalled client wakes up: hello, its snapshots, then the steps that were
        # still queued for it (the newer ones were dropped) ...
        msgs = _drain(stalled)
        assert [m["type"] for m in msgs[:3]] == ["hello", "snapshot", "snapshot"]
        seqs = [m["seq"] for m in msgs if m["type"] == "step"]
        assert seqs == list(range(msgs[2]["seq"] + 1, msgs[2]["seq"] + 1 + len(seqs)))
        assert len(seqs) <= STEP_BUFFER
        # ... and the next step it sees jumps: a gap, so it asks for a snapshot.
        _run(busy, 1)
        later = [m["seq"] for m in _drain(stalled) if m["type"] == "step"]
        assert later and later[0] > seqs[-1] + 1
        stalled.send(json.dumps({"type": "snapshot"}))
        while True:
            m = json.loads(stalled.recv(timeout=10))
            if m["type"] == "snapshot":
                break
        assert m["seq"] == busy.snapshot().seq  # idle now: both see the latest step
        stalled.close()
