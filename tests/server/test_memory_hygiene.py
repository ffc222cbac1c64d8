"""The engine thread's memory bounds (engine.engine_core.memory_hygiene); what they buy is a
soak figure (bench/soak.py), measured there, not here."""

from __future__ import annotations

import gc
import os
import weakref

from engine.core.sampling_params import SamplingParams
from engine.protocol import Ok, Restart, Submit
from engine.engine_core.memory_hygiene import (
    CPU_SHAPE_CACHE_ENTRIES, SHAPE_CACHE_SWITCHES, Trimmer, bound_cpu_shape_caches, freeze_heap,
)
from tests.server.door import door, make_door  # noqa: F401 (fixtures)


def test_the_shape_caches_are_bounded_unless_the_operator_says(monkeypatch):
    for switch in SHAPE_CACHE_SWITCHES:
        monkeypatch.delenv(switch.name, raising=False)
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


def test_freezing_keeps_collections_off_the_frozen_heap_and_new_garbage_collectable():
    class Node:
        pass

    old = Node()
    old.me = old  # a cycle alive at the freeze, garbage after it
    ref = weakref.ref(old)
    try:
        frozen = freeze_heap()
        assert frozen == gc.get_freeze_count() > 1000
        del old
        gc.collect()
        assert ref() is not None  # frozen: full collections skip it (what the freeze is for)
        new = Node()
        new.me = new  # made after the freeze: collected as ever
        ref_new = weakref.ref(new)
        del new
        gc.collect()
        assert ref_new() is None
        freeze_heap()  # the next run's freeze unfreezes first: the old cycle goes
        assert ref() is None
    finally:
        gc.unfreeze()


def test_the_engine_thread_freezes_each_run_and_a_restart_frees_the_old_engine(door):
    assert door.worker.frozen_objects > 1000 and gc.get_freeze_count() > 0
    old = weakref.ref(door.worker.engine)
    sink = door.sink()
    door.mailbox.send(sink, Restart({"num_kv_blocks": 32}))
    door.pump(lambda: any(isinstance(i, Ok) for i in sink.items), 60)
    assert door.worker.engine.describe()["num_blocks"] == 32
    # the old engine (its cycles too) was collected before the new heap was frozen
    assert old() is None
    assert door.worker.frozen_objects > 1000
