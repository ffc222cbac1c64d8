"""Runs made by the real engine core without a model, for dashboard tests.

The scheduler is driven with deterministic fake tokens (tests/core/driver.py), its
events folded into StepRecords with real metrics, and optionally written to a
SQLite file with the real Recorder, so Replay and Compare read exactly what a
served run would leave behind.
"""

from __future__ import annotations

import time

from engine.events.metrics.step_metrics import LatencyObservations, MetricsConfig, MetricsTracker
from engine.events.schema.step import StepRecord
from engine.store.recorder import Recorder

from tests.core.driver import make_scheduler, req, step

SYSTEM = list(range(100, 124))  # a 24-token shared "system prompt"


def workload(n_shared: int = 6, n_forks: int = 2) -> list[tuple[str, list[int], int, int]]:
    """(request id, prompt ids, n, max_tokens): shared prefixes, forks and one long prompt."""
    w = [(f"sys-{i}", SYSTEM + [200 + i, 201 + i, 202 + i], 1, 6) for i in range(n_shared)]
    w += [(f"fork-{i}", SYSTEM[:9] + [300 + i], 3, 5) for i in range(n_forks)]
    w.append(("long", list(range(400, 440)), 1, 8))
    return w


def make_records(block_size: int = 4, num_blocks: int = 48, budget: int = 32,
                 chunked: bool = True, prefix: bool = True, arrivals_per_step: int = 2,
                 work=None, max_model_len: int = 64):
    """Drive the core over ``work``; returns (config dict, [StepRecord], {rid: max_tokens})."""
    s = make_scheduler(block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len,
                       budget=budget, max_num_seqs=8, chunked=chunked, prefix=prefix)
    tracker = MetricsTracker(MetricsConfig(block_size, num_blocks, budget))
    pending = list(work if work is not None else workload())
    max_tokens = {rid: mt for rid, _, _, mt in pending}
    records, seq, ts = [], 0, time.time()
    first_seen: dict[str, float] = {}
    while pending or s.has_unfinished_requests():
        for rid, toks, n, mt in pending[:arrivals_per_step]:
            s.add_request(req(rid, toks, max_tokens=mt, n=n))
            first_seen[rid] = ts
        pending = pending[arrivals_per_step:]
        step(s)
        ts += 0.05
        events = s.log.drain()
        ttft = tuple(ts - first_seen.pop(e.request_id) for e in events
                     if e.type == "request_progress" and e.request_id in first_seen)
        itl = tuple(0.05 for e in events if e.type == "request_progress" and e.new_token_ids)
        snap = s.snapshot()
        metrics = tracker.update(events, snap.summary(), ts,
                                 LatencyObservations(ttft, itl[len(ttft):]))
        records.append(StepRecord(seq, snap.step, ts, events, metrics))
        seq += 1
        if seq > 2000:
            raise AssertionError("fake workload did not finish")
    config = {"num_blocks": num_blocks, "block_size": block_size, "max_model_len": max_model_len,
              "max_num_batched_tokens": budget, "max_num_seqs": 8,
              "enable_prefix_caching": prefix, "enable_chunked_prefill": chunked,
              "model": "fake-core"}
    return config, records, max_tokens


def record_run(db_path: str, label: str | None = None, **kw) -> str:
    """Write one fake run (see ``make_records``) to ``db_path``; returns its run id."""
    config, records, max_tokens = make_records(**kw)
    with Recorder(db_path) as rec:
        run_id = rec.start_run(config, model="fake-core", label=label)
        for r in records:
            rec.record_step(r)
        for rid, mt in max_tokens.items():
            rec.record_request(rid, prompt=f"prompt of {rid}", params={"max_tokens": mt, "n": 1},
                               outputs=[{"index": 0, "text": "…", "token_ids": []}])
        rec.finish()
    return run_id


def big_snapshot(num_blocks: int = 1024, block_size: int = 16, num_requests: int = 64) -> tuple:
    """A busy pool: 64 running requests with shared prefixes on 1024 blocks.

    Returns (snapshot, last step's events)."""
    s = make_scheduler(block_size=block_size, num_blocks=num_blocks, max_model_len=2048,
                       budget=8192, max_num_seqs=num_requests)
    shared = list(range(1000, 1000 + 4 * block_size))
    for i in range(num_requests):
        s.add_request(req(f"r{i}", shared + list(range(i * 300, i * 300 + 150 + i)),
                          max_tokens=200, n=1))
    for _ in range(3):
        step(s)
        events = s.log.drain()
    return s.snapshot(), events
