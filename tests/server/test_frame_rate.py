"""Each websocket connection's inbound rate (engine.server.websocket.frame_rate): a client sending
faster than its frames or bytes per second is read no faster, nothing of it is refused,
the pause is counted in /metrics, and other connections are read meanwhile."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.config import EngineConfig
from engine.server.app import ServerOptions
from engine.server.websocket.frame_rate import FrameRate, RateLimit
from tests.server.helpers import healthz, metric, raw


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_buckets_allow_a_burst_then_the_rate():
    clock = Clock()
    rate = FrameRate(RateLimit(frames_per_s=10, frame_burst=3, bytes_per_s=1000, byte_burst=500), clock)
    assert [rate.charge(10) for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert rate.charge(10) == pytest.approx(0.1)  # one frame over: 1/10 s
    assert rate.charge(10) == pytest.approx(0.2)
    clock.t += 0.2  # the hub slept it off: the debt is repaid, nothing saved up
    assert rate.charge(10) == pytest.approx(0.1)
    clock.t += 10.0  # idle: back to the burst, never more
    assert [rate.charge(1) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.charge(1) == pytest.approx(0.1)
    # bytes: 500 of burst, then 1000 a second; the longer wait of the two buckets wins
    clock.t += 10.0
    assert rate.charge(400) == 0.0
    assert rate.charge(300) == pytest.approx(0.2)  # 200 bytes over at 1000/s
    clock.t += 0.2
    assert rate.charge(1_000_000) == pytest.approx(1000.0)  # one huge frame: its own bytes' time


def test_a_rate_of_zero_is_no_bound_and_bad_rates_are_refused(tiny_llama):
    rate = FrameRate(RateLimit(frames_per_s=0, frame_burst=1, bytes_per_s=0, byte_burst=1), Clock())
    assert {rate.charge(1 << 20) for _ in range(10_000)} == {0.0}
    for bad in ({"frames_per_s": -1}, {"bytes_per_s": float("nan")}, {"frame_burst": 0},
                {"byte_burst": 1.5}, {"frames_per_s": True}):
        with pytest.raises(ValueError):
            RateLimit(**bad)
    with pytest.raises(ValueError, match="frames_per_s"):
        ServerOptions(EngineConfig(model=tiny_llama), max_frames_per_s=-5)


def test_a_ping_flood_is_read_at_the_rate_and_every_ping_is_answered(make_server):
    server = make_server(max_frames_per_s=100)
    flood = raw(server.url)
    other = raw(server.url)
    assert healthz(server.port)["status"] == "ready"
    n = 400 + 300  # the burst, then 3 s at 100 a second
    for _ in range(n):
        flood.send('{"type":"ping"}')
    # another connection is read at once meanwhile: its pings are answered while the
    # flood's last ones still wait in the flood's socket
    for _ in range(5):
        other.send('{"type":"ping"}')
    theirs = [json.loads(other.recv(timeout=20)) for _ in range(5)]
    pongs = [json.loads(flood.recv(timeout=30)) for _ in range(n)]
    assert {m["type"] for m in pongs + theirs} == {"pong"}  # nothing refused
    server_times = [m["ts"] for m in pongs]
    # past the burst the server answered no faster than 100 a second (its own clock):
    # 299 frames take 2.99 s, less what refilled while the burst itself was read (a slow
    # box reads it slower); without the bound all 700 take a few tens of milliseconds
    assert server_times[-1] - server_times[400] >= 2.0, server_times[-1] - server_times[400]
    assert max(m["ts"] for m in theirs) < server_times[-1] - 1.0
    assert metric(server.port, "kvscope_ws_throttled_seconds_total") >= 2.0
    hello_limits = server.options.limits()
    assert hello_limits["max_frames_per_s"] == 100
    flood.close()
    other.close()


def test_a_byte_flood_is_read_at_the_byte_rate(make_server):
    # 1 MiB a second after a burst of 4 MiB; 12 frames of 512 KiB of junk: 2 MiB over
    server = make_server(max_inbound_bytes_per_s=1 << 20)
    ws = raw(server.url)
    junk = "x" * (512 << 10)
    done = threading.Event()

    def send_all() -> None:
        for _ in range(12):
            ws.send(junk)
        done.set()

    t0 = time.monotonic()
    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    answers = [json.loads(ws.recv(timeout=30)) for _ in range(12)]
    elapsed = time.monotonic() - t0
    assert [a["code"] for a in answers] == ["bad_json"] * 12  # each frame answered, none dropped
    # 6 MiB read by the 12th answer: the burst's 4 MiB, and 1.5 MiB more (the 12th
    # frame's own bytes are paid after it is answered) refilled at 1 MiB/s, less what
    # refilled while the burst was read; unbounded, all 12 take ~0.1 s
    assert elapsed >= 1.0, elapsed
    assert done.wait(10)
    assert metric(server.port, "kvscope_ws_throttled_seconds_total") >= 1.0
    ws.close()
