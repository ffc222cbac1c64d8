"""The engine thread's memory bounds (engine.server.memory_hygiene); what they buy is a
soak figure (bench/soak.py), measured there, not here."""

from __future__ import annotations

import os

from engine.core.sampling_params import SamplingParams
from engine.protocol import Submit
from engine.server.memory_hygiene import (
    CPU_SHAPE_CACHE_ENTRIES, SHAPE_CACHE_ENV, Trimmer, bound_cpu_shape_caches,
)
from tests.server.door import door, make_door  # noqa: F401 (fixtures)


def test_the_shape_caches_are_bounded_unless_the_operator_says(monkeypatch):
    for name in SHAPE_CACHE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    bound_cpu_shape_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(CPU_SHAPE_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_the_trimmer_trims_once_per_interval_and_survives_a_failing_trim():
    now, calls = [100.0], []
    t = Trimmer(30.0, lambda: calls.append(now[0]), lambda: now[0])
    for step in (10.0, 10.0, 10.0, 5.0, 30.0):
        now[0] += step
        t.tick()
    assert calls == [130.0, 165.0] and t.calls == 2

    def boom():
        raise OSError("no")

    bad = Trimmer(1.0, boom, lambda: now[0])
    now[0] += 2
    bad.tick()  # logged, then off
    assert bad.trim is None
    bad.tick()


def test_the_engine_thread_trims_while_it_serves(door):
    """A serving engine thread ticks its trimmer (glibc's malloc_trim on Linux)."""
    assert door.worker.trimmer.trim is not None  # glibc here
    calls = []
    door.worker.trimmer.trim, door.worker.trimmer.interval = lambda: calls.append(1), 0.0
    a = door.sink()
    door.mailbox.send(a, Submit(prompt=[5, 6, 7], params=SamplingParams(max_tokens=3), request_id="r"))
    door.pump(lambda: a.finished("r") is not None)
    assert calls
