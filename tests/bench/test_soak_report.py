"""bench.soak_report on a recording made by hand: exact step gaps, and the steps the
slowest good request lived in against the median one's."""

import json
import sqlite3

from bench.soak_report import quantile, slowest_requests, step_gaps


def sched(rid, n):
    return {"type": "request_scheduled", "request_id": rid, "num_tokens": n}


def recording():
    conn = sqlite3.connect(":memory:")
    conn.execute("create table steps (run_id text, seq integer, step integer, ts real, events text, metrics text)")
    conn.execute("create table requests (run_id text, request_id text, timings text)")
    steps = [  # (ts, scheduled, requests running after the step)
        (0.00, [sched("good-1", 5)], 1),
        (0.10, [sched("good-1", 1), sched("flood-1", 1), sched("flood-2", 1)], 3),
        (0.30, [sched("good-1", 1), sched("flood-1", 20)], 0),
        (1.00, [sched("good-2", 3)], 1),
        (1.01, [sched("good-2", 1)], 0),
        (2.00, [sched("good-3", 4)], 1),
        (2.02, [sched("good-3", 1)], 0),
    ]
    for seq, (ts, events, running) in enumerate(steps):
        events = events + [{"type": "block_allocated", "block": seq}]  # not a schedule: ignored
        conn.execute("insert into steps values ('r', ?, ?, ?, ?, ?)",
                     (seq, seq + 1, ts, json.dumps(events), json.dumps({"num_requests_running": running})))
    for rid, arrival, e2e in (("good-0", -5.0, 9.0), ("good-1", 0.0, 0.5), ("good-2", 1.0, 0.02),
                              ("good-3", 2.0, 0.03), ("flood-1", 0.0, 0.4)):
        conn.execute("insert into requests values ('r', ?, ?)",
                     (rid, json.dumps({"arrival_time": arrival, "e2e": e2e})))
    return conn


def test_step_gaps_split_stalls_while_running_from_waits_after_idle():
    assert step_gaps(recording(), 0.0) == {
        "over_s": 0.08, "while_running": 2, "after_idle": 2,
        "max_while_running_s": 0.2, "max_after_idle_s": 0.99}


def test_the_slowest_request_is_shown_with_the_steps_it_lived_in():
    got = slowest_requests(recording(), 0.0)  # good-0 arrived before: not counted
    # good-1: 3 steps of 0 (its arrival), 100 and 200 ms, holding 1, 3 and 2 sequences
    # and 5, 3 and 21 tokens; the median of good-1, good-3, good-2 by e2e is good-3
    assert got == {"share": 0.01,
                   "slowest": {"requests": 1, "e2e_s": 0.5, "steps_per_request": 3.0,
                               "step_ms": 100.0, "seqs_per_step": 2.0, "tokens_per_step": 9.67},
                   "median": {"requests": 1, "e2e_s": 0.03, "steps_per_request": 2.0,
                              "step_ms": 10.0, "seqs_per_step": 1.0, "tokens_per_step": 2.5}}
    assert slowest_requests(recording(), 100.0) == {"share": 0.01, "slowest": None, "median": None}


def test_quantile():
    assert quantile([], 0.5) is None
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([float(i) for i in range(100)], 0.99) == 99.0
