"""What the soak reads out of its server's recording (``bench.soak``): step gaps, and
which steps the slowest good requests spent their lives in.

Pure SQLite and arithmetic over the ``steps`` and ``requests`` tables
(``engine.store.db``), so it is tested on a recording made by hand.
"""

from __future__ import annotations

import json
import sqlite3
import statistics

GAP_S = 0.08  # step gaps longer than this are reported (quiet steps of the tiny model: 2-5 ms)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def step_gaps(conn: sqlite3.Connection, mix_wall: float, over_s: float = GAP_S) -> dict:
    """Gaps between consecutive recorded steps of the mix longer than ``over_s``: while
    requests ran in the step before (a stall every running request saw) or after the
    engine had gone idle (waiting for the next request: time on the clients' side)."""
    rows = [(ts, json.loads(m).get("num_requests_running", 0)) for ts, m in
            conn.execute("select ts, metrics from steps where ts >= ? order by seq", (mix_wall,))]
    running, idle = [], []
    for (t0, before), (t1, _) in zip(rows, rows[1:]):
        if t1 - t0 > over_s:
            (running if before else idle).append(t1 - t0)
    return {"over_s": over_s, "while_running": len(running), "after_idle": len(idle),
            "max_while_running_s": round(max(running, default=0.0), 3),
            "max_after_idle_s": round(max(idle, default=0.0), 3)}


def slowest_requests(conn: sqlite3.Connection, since: float, prefix: str = "good",
                     share: float = 0.01) -> dict:
    """The steps the slowest ``share`` of the ``prefix`` requests that arrived at or after
    ``since`` lived in, against as many median ones: how many steps, how long each (from
    the step before, or from the request's arrival if later), and how many sequences and
    tokens each held. A tail of long steps holding many sequences is other clients' work
    in the same steps; long steps holding few are waits outside the steps' own work."""
    steps = []  # (commit time, previous step's commit time, sequences, tokens, request ids)
    prev = None
    for ts, events in conn.execute("select ts, events from steps order by run_id, seq"):
        sched = [e for e in json.loads(events) if e["type"] == "request_scheduled"]
        steps.append((ts, prev, len(sched), sum(e["num_tokens"] for e in sched),
                      [e["request_id"] for e in sched]))
        prev = ts
    lived: dict[str, list[tuple[float, float | None, int, int]]] = {}
    for ts, before, n, tok, ids in steps:
        for rid in ids:
            lived.setdefault(rid, []).append((ts, before, n, tok))
    e2e: dict[str, float] = {}
    arrival: dict[str, float] = {}
    for rid, t in conn.execute("select request_id, timings from requests where request_id like ?",
                               (prefix + "%",)):
        t = json.loads(t)
        if t["arrival_time"] >= since and rid in lived:
            e2e[rid], arrival[rid] = t["e2e"], t["arrival_time"]
    if not e2e:
        return {"share": share, "slowest": None, "median": None}
    ranked = sorted(e2e, key=lambda r: -e2e[r])

    def of(rids: list[str]) -> dict:
        ss = [(ts - max(before if before is not None else ts, arrival[r]), n, tok)
              for r in rids for ts, before, n, tok in lived[r]]
        return {"requests": len(rids), "e2e_s": round(statistics.mean(e2e[r] for r in rids), 4),
                "steps_per_request": round(len(ss) / len(rids), 2),
                "step_ms": round(1e3 * statistics.mean(d for d, _, _ in ss), 2),
                "seqs_per_step": round(statistics.mean(n for _, n, _ in ss), 2),
                "tokens_per_step": round(statistics.mean(k for _, _, k in ss), 2)}

    k = max(1, int(len(ranked) * share))
    mid = len(ranked) // 2
    return {"share": share, "slowest": of(ranked[:k]), "median": of(ranked[mid:mid + k])}
