"""Soak: ``kvscope serve`` under well-behaved and hostile clients at once (issue 17).

    python -m bench.soak --minutes 10            # tiny random-weight Llama (fast steps)
    python -m bench.soak --minutes 10 --model smollm2-135m

Not a test: it runs for minutes and its figures depend on the box. It starts one
server on 127.0.0.1 (a free port, its own SQLite file, ``--no-client-restart``), then

1. a quiet baseline: the good clients alone (a fifth of the time, at least 30 s),
   each sending greedy requests one after another, latency per request recorded;
2. the mix: the same good clients, plus hostile ones in bounded loops: a reader
   that never reads and asks for 100 snapshots and thousands of pings, malformed
   and oversized frames, out-of-range parameters (issue 17's seeds and top_k, a dict
   stop, odd chat roles, 900 KB prompts), floods of submits up to the in-flight cap
   then a disconnect, restarts, and connection churn. They run in a process of their
   own, so that their tight loops do not hold the good clients' GIL.

It reports requests served, the server's RSS (its process and the engine's, summed; start of
the mix, peak, end), the good
clients' p50/p99 latency quiet vs mixed (as they measured it, and as the server
recorded it), the recorder's backlog (peak, from
/metrics), rows recorded against requests served (SQLite, after the server stops),
the mix's step gaps over 80 ms (while requests ran, or after the engine went idle), the
steps the slowest 1% of good requests lived in against the median's (how long, how many
sequences and tokens: ``bench.soak_report``),
the box's load average over the run, and whether the goals hold: RSS growth within
100 MB, mixed p99 within 2x quiet, 100% of served requests recorded. Everything
stops by itself at the deadline.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from bench.mem_probe import rss_mb
from bench.soak_clients import HOSTILE, Tally, good_client, hostile_clients
from bench.soak_report import quantile, slowest_requests, step_gaps

RSS_GOAL_MB = 100
P99_GOAL = 2.0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _rss_mb(pid: int) -> float:
    """The server's resident memory: its process and every process under it (the
    engine's own, kvscope serve's default), summed."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += rss_mb(p)
        except OSError:
            if p == pid:
                return float("nan")
            continue
        todo += _children(p)
    return total


def _metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


# ---- the run -----------------------------------------------------------------------------


def _start_server(model: str, db: str, extra: list[str], probe: str | None = None,
                  probe_s: float = 30.0, trace_from_s: float = 0.0) -> tuple[subprocess.Popen, int]:
    launcher = ["engine.cli"] if probe is None else ["bench.mem_probe", probe, str(probe_s),
                                                     str(trace_from_s)]
    cmd = [sys.executable, "-m", *launcher, "serve", "--model", model, "--port", "0", "--db", db,
           "--label", "soak", "--no-client-restart", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(r"ws://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    port = int(m.group(1))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                if json.loads(r.read())["status"] == "ready":
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def run(minutes: float, model: str, good: int, extra: list[str], probe: str | None = None,
        probe_s: float = 30.0, hostile_kinds: tuple[str, ...] = HOSTILE) -> dict:
    tmp = tempfile.mkdtemp(prefix="kvscope-soak-")
    db = os.path.join(tmp, "runs.sqlite")
    quiet_s = max(30.0, minutes * 60 / 5)
    # tracing from the mix's second minute: the batch has grown to the flooders' size
    proc, port = _start_server(model, db, extra, probe, probe_s, quiet_s + 60 + 30)
    url = f"ws://127.0.0.1:{port}"
    tally, phase, stop = Tally(), ["quiet"], threading.Event()
    total = minutes * 60
    loads, rss, backlog = [], [], []
    goods = [threading.Thread(target=good_client, args=(url, tally, phase, stop, k), daemon=True)
             for k in range(good)]
    for t in goods:
        t.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < quiet_s:
        time.sleep(1)
        loads.append(os.getloadavg()[0])
    rss_start = _rss_mb(proc.pid)
    phase[0] = "mixed"
    mix_wall = time.time()  # requests that arrived from here on are the mix's
    # The hostile clients run in a process of their own: in this one their tight loops
    # would hold this process's GIL, and the good clients' latency would measure the
    # soak, not the server. They still share the box's cores, as they would a server's.
    hostile_out = os.path.join(tmp, "hostile.json")
    hostile = multiprocessing.get_context("spawn").Process(
        target=hostile_clients, args=(url, hostile_kinds, total - (time.monotonic() - t0), hostile_out),
        daemon=True)
    hostile.start()
    while time.monotonic() - t0 < total:
        time.sleep(5)
        loads.append(os.getloadavg()[0])
        rss.append(_rss_mb(proc.pid))
        b = _metric(port, "kvscope_recorder_backlog_steps")
        if b is not None:
            backlog.append(b)
    stop.set()
    for t in goods:
        t.join(60)
    hostile.join(90)
    if hostile.is_alive():
        hostile.kill()
    with open(hostile_out) as f:
        theirs = json.load(f)
    tally.accepted.update(theirs["accepted"])
    tally.hostile_ops, tally.closes = theirs["hostile_ops"], theirs["closes"]
    tally.hostile_errors = theirs["hostile_errors"]
    time.sleep(2)  # the last finished requests reach the recorder
    rss_end = _rss_mb(proc.pid)
    closes = _metric(port, "kvscope_ws_slow_client_closes_total")
    proc.terminate()
    proc.wait(60)
    with sqlite3.connect(db) as conn:
        gaps = step_gaps(conn, mix_wall)
        slowest = slowest_requests(conn, mix_wall)
        recorded = {r[0] for r in conn.execute("select request_id from requests")}
        finish = dict(conn.execute("select request_id, outputs from requests"))
        timings = {r: json.loads(t) for r, t in
                   conn.execute("select request_id, timings from requests where request_id like 'good%'")}
    good_ids = {r for r in tally.accepted if r.startswith("good")}
    good_ok = sum(1 for r in good_ids if r in finish and '"length"' in finish[r])
    q, mx = tally.good_latency["quiet"], tally.good_latency["mixed"]
    served = len(tally.accepted)
    res = {
        "model": model, "minutes": minutes, "quiet_s": quiet_s, "good_clients": good,
        "hostile": list(hostile_kinds),
        "requests_served": served, "good_requests": {"quiet": len(q), "mixed": len(mx)},
        "good_failures": tally.good_failures[:10], "num_good_failures": len(tally.good_failures),
        "hostile_ops": tally.hostile_ops, "hostile_errors": tally.hostile_errors,
        "slow_client_closes": closes,
        # RSS every 5 s of the mix; "after 1 min": from the first minute's end (torch's
        # allocator grows once to the mix's larger batches), the flatness that matters
        "rss_mb": {"mix_start": round(rss_start, 1), "peak": round(max(rss or [rss_start]), 1),
                   "end": round(rss_end, 1), "growth": round(rss_end - rss_start, 1),
                   "after_1min": round(rss[11], 1) if len(rss) > 12 else None,
                   "growth_after_1min": round(rss_end - rss[11], 1) if len(rss) > 12 else None,
                   "series": [round(r) for r in rss[::6]]},
        "latency_s": {"quiet_p50": quantile(q, 0.5), "quiet_p99": quantile(q, 0.99),
                      "mixed_p50": quantile(mx, 0.5), "mixed_p99": quantile(mx, 0.99)},
        # the same requests as the server recorded them (arrival to finish, no client side)
        "server_e2e_s": {
            f"{ph}_{q}": quantile([t["e2e"] for t in timings.values()
                             if (t["arrival_time"] >= mix_wall) == (ph == "mixed")], qv)
            for ph in ("quiet", "mixed") for q, qv in (("p50", 0.5), ("p99", 0.99))},
        "recorder_backlog_steps": {"peak": max(backlog, default=None),
                                   "mean": statistics.mean(backlog) if backlog else None},
        "step_gaps": gaps,
        # the steps the mix's slowest 1% of good requests lived in, against the median's
        "slowest_good": slowest,
        "rows_recorded": len(recorded & tally.accepted), "good_rows_finished_length": good_ok,
        "load_avg_1m": {"mean": round(statistics.mean(loads), 2), "max": round(max(loads), 2)},
    }
    p99q, p99m = res["latency_s"]["quiet_p99"], res["latency_s"]["mixed_p99"]
    res["goals"] = {
        "rss_flat_within_100mb": res["rss_mb"]["peak"] - rss_start <= RSS_GOAL_MB,
        "p99_within_2x_quiet": bool(p99q and p99m and p99m <= P99_GOAL * p99q),
        "all_served_recorded": res["rows_recorded"] == served,
    }
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--model", default="tiny", help="'tiny' (a random-weight Llama) or any kvscope model")
    p.add_argument("--good-clients", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--mem-probe", default=None, metavar="JSONL",
                   help="run the server under bench.mem_probe (tracemalloc, gc counts, malloc "
                        "arenas) and append its probes here; slows the server, so figures differ")
    p.add_argument("--probe-interval", type=float, default=30.0, metavar="S")
    p.add_argument("--hostile", default=",".join(HOSTILE), metavar="KINDS",
                   help="which hostile clients run in the mix (default all: %(default)s); fewer "
                        "is for finding what costs the good clients, not a soak")
    args, extra = p.parse_known_args(argv)
    model = args.model
    if model == "tiny":
        from tests.tiny_models import tiny_model_dir

        model = str(tiny_model_dir("llama"))
        extra = ["--block-size", "16", "--num-kv-blocks", "256", "--max-model-len", "256", *extra]
    kinds = tuple(k for k in args.hostile.split(",") if k)
    if not set(kinds) <= set(HOSTILE):
        p.error(f"--hostile takes some of {','.join(HOSTILE)}")
    res = run(args.minutes, model, args.good_clients, extra, args.mem_probe, args.probe_interval, kinds)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if all(res["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
