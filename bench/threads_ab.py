"""Thread-policy A/B: 1 torch thread vs 2 with each OpenMP wait policy, quiet and loaded.

    python -m bench.threads_ab [--rounds 10] [--loads none,busy] [--policies ...] [--json PATH]

torch's CPU kernels run on GNU OpenMP (libgomp), which reads its wait policy once,
when the library loads with ``import torch``; so each policy needs its own process.
Each policy gets a worker process (its environment set before Python starts) that
loads the model and builds its units (bench/cpu_units.py) once, then runs units on
command. The coordinator interleaves them: in every round each worker runs every unit
in turn, the policies in a rotating order, with a short pause between units so a
worker's spinning threads have gone to sleep before the next one starts. Other jobs'
load then hits all policies alike. Reported per unit: the median step time of each
policy, and the median over rounds of (policy's median step / 1 thread's).

Loads: ``none`` (the box as it is), ``busy`` (this script starts one single-threaded
busy-loop process, the worst case for a barrier-synchronised second thread: a third
runnable task on two cores) and ``bursty`` (the same process, busy 20 ms in every
40 ms, like a dashboard redrawing). The load process ends with its condition; a
deadline inside it bounds it even if this script dies.

libgomp's policies (its env.c): OMP_WAIT_POLICY unset = spin ~300k iterations (~3 ms)
at a barrier, then sleep; PASSIVE = sleep at once; GOMP_SPINCOUNT=N = spin N first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# key -> (label, torch threads, environment); the OpenMP variables not named are
# removed from the worker's environment
POLICIES: dict[str, tuple[str, int, dict[str, str]]] = {
    "1t": ("1 thread", 1, {}),
    "2t-passive": ("2 threads, OMP_WAIT_POLICY=PASSIVE", 2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "2t-spin1k": ("2 threads, GOMP_SPINCOUNT=1000", 2, {"GOMP_SPINCOUNT": "1000"}),
    "2t-spin10k": ("2 threads, GOMP_SPINCOUNT=10000", 2, {"GOMP_SPINCOUNT": "10000"}),
    # libgomp's own default (OMP_WAIT_POLICY unset), stated explicitly so that a default
    # kvscope sets when nothing is exported stays out of this worker
    "2t-default": ("2 threads, libgomp default wait (GOMP_SPINCOUNT=300000)", 2,
                   {"GOMP_SPINCOUNT": "300000"}),
    # kvscope's default: the engine's own choice, its CoreGovernor on (engine/cpu_threads.py)
    "governed": ("2 threads, GOMP_SPINCOUNT=10000, governed (kvscope's default)", 2,
                 {"GOMP_SPINCOUNT": "10000"}),
}
GOVERNED = {"governed"}  # not pinned: the engine's CoreGovernor may change the count
_OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KVSCOPE_NUM_THREADS",
             "KMP_BLOCKTIME", "MKL_NUM_THREADS")
UNITS = {"decode_1": 12, "decode_16": 4, "decode_64": 2, "prefill_512": 1}  # unit -> steps per call
LOADS = ("none", "busy", "bursty")
_PAUSE_S = 0.05  # > libgomp's default ~3 ms spin: the last worker's threads are asleep


# ---- worker side -------------------------------------------------------------------

def _worker(threads: int, model: str, rounds: int, governed: bool = False) -> None:
    import torch

    from bench.cpu_units import DecodeBatch, Prefill, decode_max_tokens, fitting_prompt_len
    from bench.run_kvscope import make_engine
    from engine.model.loader import load_model

    loaded = load_model(model)
    vocab = loaded.spec.vocab_size
    units = {}
    for name, steps in UNITS.items():
        kind, n = name.split("_")
        n = int(n)
        if kind == "decode":
            max_tokens = decode_max_tokens(n, 64, 1 + rounds * steps * len(LOADS))  # + the warm-up
            need = 64 + max_tokens + 16
            eng = make_engine(loaded, model, n, n * -(-need // 16) + 8, enable_prefix_caching=False,
                              max_model_len=need)
            units[name] = DecodeBatch(eng, vocab, n, 64, max_tokens=max_tokens)
        else:
            n = fitting_prompt_len(loaded, n)
            eng = make_engine(loaded, model, 1, -(-(n + 16) // 16) + 8, enable_prefix_caching=False,
                              max_model_len=n + 16, max_num_batched_tokens=max(512, n))
            units[name] = Prefill(eng, vocab, n)
    for name, unit in units.items():  # warm-up call of each, not reported
        unit.run(1) if name.startswith("decode") else unit.run()
    if not governed and torch.get_num_threads() != threads:
        raise RuntimeError(f"worker runs {torch.get_num_threads()} torch threads, asked for {threads}")
    print(json.dumps({"ready": True, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        unit = units[name]
        timing = unit.run(UNITS[name]) if name.startswith("decode") else unit.run()
        print(json.dumps(dict(timing.to_dict(), torch_threads=torch.get_num_threads())), flush=True)


# ---- coordinator side --------------------------------------------------------------

class Worker:
    def __init__(self, policy: str, model: str, rounds: int) -> None:
        _, threads, extra = POLICIES[policy]
        env = {k: v for k, v in os.environ.items() if k not in _OMP_VARS}
        env.update(extra)
        if policy not in GOVERNED:
            env["KVSCOPE_NUM_THREADS"] = str(threads)  # the engine's own choice must not override it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH")]))
        self.policy = policy
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.threads_ab", "--worker", str(threads), "--model", model,
             "--rounds", str(rounds), *(["--governed"] if policy in GOVERNED else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def wait_ready(self) -> dict:
        return self._reply()

    def run(self, unit: str) -> dict:
        self.proc.stdin.write(unit + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.policy!r} exited (code {self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_LOAD_CODE = """
import sys, time
deadline, duty, period = time.time() + float(sys.argv[1]), float(sys.argv[2]), 0.04
while time.time() < deadline:
    t = time.time()
    while time.time() - t < duty * period:
        pass
    if duty < 1:
        time.sleep((1 - duty) * period)
"""


def start_load(kind: str, max_seconds: float) -> subprocess.Popen | None:
    """One busy-loop process (``busy``: always, ``bursty``: 50% duty), ending by itself
    after ``max_seconds`` at the latest; None for ``none``."""
    if kind == "none":
        return None
    duty = {"busy": 1.0, "bursty": 0.5}[kind]
    return subprocess.Popen([sys.executable, "-c", _LOAD_CODE, str(max_seconds), str(duty)])


def _pressure() -> float | None:
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])  # some avg10
    except (OSError, ValueError, IndexError):
        return None


def run(policies: list[str], loads: list[str], rounds: int, model: str, progress: bool = True) -> dict:
    from bench.measure import loadavg

    workers = [Worker(p, model, rounds) for p in policies]
    try:
        threads = {w.policy: w.wait_ready()["threads"] for w in workers}
        out: dict = {"policies": {p: {"label": POLICIES[p][0], "threads": POLICIES[p][1],
                                      "env": POLICIES[p][2], "torch_threads": threads[p]}
                                  for p in policies},
                     "units": UNITS, "rounds": rounds, "loads": {}}
        for load in loads:
            times = {(p, u): [] for p in policies for u in UNITS}  # per round: median step s
            cpus = {(p, u): [] for p in policies for u in UNITS}
            used = {(p, u): [] for p in policies for u in UNITS}  # torch threads after each call
            before = {"loadavg": loadavg(), "psi_avg10": _pressure()}
            hog = start_load(load, max_seconds=3600)
            try:
                for r in range(rounds):
                    order = workers[r % len(workers):] + workers[:r % len(workers)]
                    for unit in UNITS:
                        for w in order:
                            time.sleep(_PAUSE_S)
                            t = w.run(unit)
                            times[(w.policy, unit)].append(statistics.median(t["wall_s"]))
                            cpus[(w.policy, unit)].append(statistics.median(t["cpu_s"]))
                            used[(w.policy, unit)].append(t["torch_threads"])
                    if progress:
                        print(f"[{load}] round {r + 1}/{rounds} load {loadavg()}", file=sys.stderr, flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
            out["loads"][load] = {"before": before, "after": {"loadavg": loadavg(), "psi_avg10": _pressure()},
                                  "units": _summarise(policies, times, cpus, used)}
        return out
    finally:
        for w in workers:
            w.close()


def _summarise(policies, times, cpus, used) -> dict:
    base = policies[0]
    res: dict = {}
    for unit in UNITS:
        res[unit] = {}
        for p in policies:
            ts = times[(p, unit)]
            res[unit][p] = {
                "median_step_ms": 1e3 * statistics.median(ts),
                "min_step_ms": 1e3 * min(ts),
                "median_cpu_ms": 1e3 * statistics.median(cpus[(p, unit)]),
                "ratio_vs_first": statistics.median(t / b for t, b in zip(ts, times[(base, unit)])),
                "round_medians_ms": [1e3 * t for t in ts],
                "torch_threads_after": used[(p, unit)],
            }
    return res


def render(res: dict) -> str:
    """Markdown: one table per load, one row per unit, a column per policy."""
    policies = list(res["policies"])
    labels = [res["policies"][p]["label"] for p in policies]
    lines = []
    for load, entry in res["loads"].items():
        b, a = entry["before"], entry["after"]
        lines += [f"Load `{load}` (load average {b['loadavg']} -> {a['loadavg']}, CPU PSI avg10 "
                  f"{b['psi_avg10']} -> {a['psi_avg10']}); median step ms, (median over rounds of the "
                  f"ratio to {labels[0]}), [CPU ms per step, all threads]:", "",
                  "| unit | " + " | ".join(labels) + " |", "|---|" + "---|" * len(policies)]
        for unit, row in entry["units"].items():
            cells = [f"{row[p]['median_step_ms']:.0f} ({row[p]['ratio_vs_first']:.2f}) "
                     f"[{row[p]['median_cpu_ms']:.0f}]" for p in policies]
            lines.append(f"| {unit} | " + " | ".join(cells) + " |")
        for p in policies:
            if p in GOVERNED:
                after = [n for row in entry["units"].values() for n in row[p]["torch_threads_after"]]
                counts = ", ".join(f"{n} thread(s) after {after.count(n)}" for n in sorted(set(after)))
                lines += ["", f"{res['policies'][p]['label']}: {counts} of {len(after)} calls."]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--governed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--loads", default="none,busy", help=f"comma-separated subset of {','.join(LOADS)}")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="comma-separated subset of " + ", ".join(f"{k} ({v[0]})" for k, v in POLICIES.items())
                   + "; the first is the ratios' reference")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.model, args.rounds, args.governed)
        return
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    bad = [x for x in policies if x not in POLICIES] + [x for x in loads if x not in LOADS]
    if bad:
        p.error(f"unknown policy or load {bad}")
    res = run(policies, loads, args.rounds, args.model)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(render(res))


if __name__ == "__main__":
    main()
