"""Issue 17 item 4: memory per client is bounded in bytes, and a client that does not
read costs only itself.

On main at 7416b2c a client that never read but sent 100 ``snapshot`` ops was owed 100
encoded snapshots (the reply bound counted 100,000 messages, not bytes): 99 of them,
60.6 MB, sat in its outbox at the 8192-block pool below (~1 GB at a 131k-block one). Now repeated requests are coalesced
(one round answers a connection once, and a newer snapshot replaces an unsent one),
every connection's unsent frames are bounded in bytes, and a connection past the
bound is closed (1008 ``slow_client``) and counted."""

from __future__ import annotations

import json
import time

from engine.client import KVScopeClient
from tests.server.helpers import GREEDY, metric
from tests.server.test_stalled import _stalled_socket


def _wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_asking_for_100_snapshots_without_reading_is_owed_one(make_server):
    server = make_server(engine={"num_kv_blocks": 8192})
    with KVScopeClient(server.url, timeout=30) as busy:
        snap_bytes = len(json.dumps(busy.snapshot().to_dict(), separators=(",", ":")))
        assert snap_bytes > 500_000  # more than the stalled socket's buffers take
        stalled = _stalled_socket(server.url)
        for _ in range(100):
            stalled.send(json.dumps({"type": "snapshot"}))
        _wait(lambda: any(c.attached for c in server.hub.conns.values() if c.id != 1))
        (conn,) = [c for c in server.hub.conns.values() if c.id != 1]
        # another client's request completes meanwhile, and then everything the stalled
        # one asked for has been answered (the engine is idle)
        fin = busy.generate("meanwhile", params=GREEDY)
        assert fin.outputs[0]["finish_reason"] == "length"
        busy.snapshot()
        box = conn.outbox
        assert box.num_snapshots <= 1  # the rest were coalesced or superseded
        # unsent: at most one snapshot (the one on the wire is out of the outbox) + small replies
        assert box.num_bytes <= snap_bytes + 16_384, box.num_bytes
        assert box.max_bytes_seen <= 2 * snap_bytes + 16_384, box.max_bytes_seen
        assert metric(server.port, "kvscope_ws_outbox_max_bytes") <= snap_bytes + 16_384
        stalled.close()


def test_a_client_past_the_byte_bound_is_closed_and_counted(make_server):
    # The snapshot (~0.7 MB) jams the stalled socket; then its pongs pile up unread.
    # no frame rate: the pongs must pile up faster than 200 a second (test_frame_rate); no
    # keepalive: the stalled socket answers no ping, so on a slow box the keepalive's timeout
    # (not the byte bound) closed it first (a fresh-clone CI run, session 17: 111 s, 0 closes)
    server = make_server(engine={"num_kv_blocks": 8192}, max_outbox_bytes=1 << 20, max_frames_per_s=0,
                         ping_interval=None)
    with KVScopeClient(server.url, timeout=30) as busy:
        assert metric(server.port, "kvscope_ws_slow_client_closes_total") == 0
        stalled = _stalled_socket(server.url)
        _wait(lambda: any(c.attached for c in server.hub.conns.values() if c.id != 1))
        # Up to ~8 MB of pongs owed, until the server closes us: the kernel's send buffer for
        # this socket takes some first (autotuned up to tcp_wmem's 4 MB; at 40,000 pongs,
        # ~1.6 MB, it sometimes took enough that the outbox never passed its 1 MB bound)
        for _ in range(200_000):
            try:
                stalled.send('{"type":"ping"}')
            except Exception:  # closed by the server under our feet: what we want
                break
        _wait(lambda: len(server.hub.conns) == 1, timeout=60)
        assert metric(server.port, "kvscope_ws_slow_client_closes_total") == 1
        assert busy.generate("still served", params=GREEDY).outputs[0]["finish_reason"] == "length"
        stalled.close()
