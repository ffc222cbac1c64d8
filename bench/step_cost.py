"""Fit ``kvscope simulate``'s step-cost table from the engine's own steps on this machine.

Runs the real engine (the default model, in this process) on a mixed workload (prompt
lengths 16 to 1,200 tokens, outputs 8 to 64, waves of 1 to 16 concurrent requests, so
steps range from one decode to full prefill chunks next to many decodes), records every
step with the Recorder, and fits ``seconds = base + a x prefill tokens + b x decode
sequences + c x context tokens`` (``engine.simulate.cost.fit_from_run``). Writes the
table to ``data/step_cost/<name>.json`` with how it was measured.

    .venv/bin/python -m bench.step_cost            # ~2-4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

from engine.simulate.cost import DATA_DIR, fit_from_run, step_features


def workload(seed: int = 0) -> list[list[tuple[list[int], int]]]:
    rng = random.Random(seed)
    waves = []
    for size in (1, 4, 16, 8, 2, 12):
        waves.append([([rng.randrange(100, 20000) for _ in range(rng.choice((16, 64, 200, 600, 1200)))],
                       rng.choice((8, 24, 64))) for _ in range(size)])
    return waves


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--name", default="smollm2-135m-cpu")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    from engine import SamplingParams
    from engine.config import EngineConfig
    from engine.cpu_threads import set_default_wait_policy
    from engine.llm_engine import build_engine
    from engine.store.recorder import Recorder
    from engine.store.runs import RunStore

    set_default_wait_policy()
    db = os.path.join(tempfile.mkdtemp(), "fit.sqlite")
    eng = build_engine(EngineConfig(model=a.model, num_kv_blocks=1024, max_num_seqs=32,
                                    max_num_batched_tokens=512, num_threads=a.threads))
    rec = Recorder(db)
    run_id = rec.start_run(eng.describe(), model=eng.model_name)
    eng.step_listeners.append(lambda r: rec.record_step(r, run_id))
    load0 = os.getloadavg()[0]
    t0 = time.time()
    for wave in workload():
        for ids, n in wave:
            eng.add_request(prompt=ids, params=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        while eng.has_unfinished_requests() or eng.has_pending_events():
            eng.step()
    wall = time.time() - t0
    import torch

    threads = torch.get_num_threads()
    eng.close()
    rec.close()
    store = RunStore(db)
    cost = fit_from_run(store, run_id)
    steps = store.load_steps(run_id)
    # how well it predicts: the fitted sum of busy steps against the measured wall time
    predicted = sum(cost.seconds(*step_features(r.events)) for r in steps)
    table = {"base": cost.base, "per_prefill_token": cost.per_prefill_token,
             "per_decode_seq": cost.per_decode_seq, "per_context_token": cost.per_context_token,
             "measured": {"model": a.model, "date": time.strftime("%Y-%m-%d"), "steps": len(steps),
                          "threads": threads, "cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count(), "load_average_at_start": round(load0, 2),
                          "wall_s": round(wall, 2), "predicted_s": round(predicted, 2),
                          "command": "python -m bench.step_cost"}}
    out = DATA_DIR / f"{a.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=2) + "\n")
    print(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
