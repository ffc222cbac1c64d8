"""Fidelity: the simulator and the engine are one core. A recorded engine run (a real
model, a real recording through the Recorder), simulated on one pod with the run's
settings and arrivals by step, makes every decision again: the same events step for
step (hence the same hits, evictions, preemptions, block ids), the same per-request
``num_cached_tokens``."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import SamplingParams
from engine.llm_engine import build_engine
from engine.simulate.cost import StepCost
from engine.simulate.simulation import SimConfig, simulate
from engine.simulate.commands import build_config
from engine.simulate.trace import read_engine_run
from engine.store.recorder import Recorder
from engine.store.runs import RunStore

COST = StepCost(0.01, 1e-4, 1e-3, 0.0)
SYSTEM = list(range(40, 88))  # a 48-token shared prefix


def _record(model: str, db: str, waves, **engine) -> tuple[str, dict]:
    """Run ``waves`` (per step: a list of (id, prompt ids, params)) through a real engine,
    recording every step; returns (run id, {request id: num_cached_tokens})."""
    cfg = EngineConfig(model=model, block_size=8, max_num_seqs=6, seed=0, **engine)
    eng = build_engine(cfg)
    rec = Recorder(db)
    run_id = rec.start_run(eng.describe(), model=eng.model_name)
    eng.step_listeners.append(lambda r: rec.record_step(r, run_id))
    cached = {}
    waves = list(waves)
    try:
        while waves or eng.has_unfinished_requests() or eng.has_pending_events():
            if waves:
                for rid, prompt, params in waves.pop(0):
                    eng.add_request(prompt=prompt, params=params, request_id=rid)
            for out in eng.step():
                if out.finished:
                    cached[out.request_id] = out.num_cached_tokens
    finally:
        eng.close()
        rec.close()
    return run_id, cached


def _compare(db: str, run_id: str, cached: dict) -> dict:
    store = RunStore(db)
    trace = read_engine_run(store, run_id)
    cfg = build_config(_Args(), trace)
    assert cfg.arrivals == "steps"
    cfg.cost = COST
    recorded = [(r.step, [e.to_dict() for e in r.events]) for r in store.load_steps(run_id)]
    sim = Recorder(db)
    result = simulate(trace, cfg, recorder=sim, label="fidelity")
    sim.close()
    simulated = [(r.step, [e.to_dict() for e in r.events]) for r in store.load_steps(result.run_ids[0])]
    assert len(simulated) == len(recorded)
    for (s1, e1), (s2, e2) in zip(recorded, simulated):
        assert (s1, e1) == (s2, e2), f"step {s1} differs"
    got = {tr.request_id: t.num_cached_tokens for tr, t in zip(trace.requests, result.requests)}
    assert got == cached
    return {"steps": len(recorded), "events": sum(len(e) for _, e in recorded),
            "counts": result.pods[0].log.counts}


class _Args:
    """The CLI's defaults: every setting from the run."""

    def __init__(self, **kw) -> None:
        self.block_size = self.num_kv_blocks = self.kv_cache_memory = self.max_num_seqs = None
        self.max_num_batched_tokens = self.max_model_len = self.enable_prefix_caching = None
        self.scheduling_policy = self.prefix_caching_hash_algo = self.kv_bytes_per_block = None
        self.pods, self.router, self.arrivals, self.step_cost = 1, "round-robin", "auto", "0.01,0.0001,0.001,0"
        self.__dict__.update(kw)


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def test_shared_prefix_run_replays_exactly(tiny_llama, tmp_path):
    waves = [[(f"a{i}", SYSTEM + [100 + i, 101 + i], _greedy(6)) for i in range(3)],
             [], [(f"b{i}", SYSTEM + [120 + i] * 9, _greedy(5)) for i in range(4)],
             [("c0", SYSTEM[:20] + [7] * 30, _greedy(8))]]
    db = str(tmp_path / "runs.sqlite")
    run_id, cached = _record(tiny_llama, db, waves, num_kv_blocks=64, max_num_batched_tokens=64)
    figures = _compare(db, run_id, cached)
    assert figures["counts"].prefix_cache_hits > 0


def test_memory_pressure_run_replays_exactly(tiny_llama, tmp_path):
    """A tiny pool: evictions and preemptions (recompute), all decided again."""
    waves = [[(f"p{i}", SYSTEM[: 16 + 4 * i] + [150 + i] * 10, _greedy(24)) for i in range(6)],
             [], [(f"q{i}", SYSTEM + [170 + i], _greedy(12)) for i in range(3)]]
    db = str(tmp_path / "runs.sqlite")
    run_id, cached = _record(tiny_llama, db, waves, num_kv_blocks=24, max_num_batched_tokens=32,
                             max_model_len=96)
    c = _compare(db, run_id, cached)["counts"]
    assert c.num_preemptions > 0 and c.num_evictions > 0


def test_stop_strings_and_stop_tokens_replay_exactly(tiny_llama, tmp_path):
    """Requests ended by a stop token (same step) and by a stop string (the next step's
    schedule) end at the same steps in the simulation."""
    from engine.tokenizer import Tokenizer

    db = str(tmp_path / "runs.sqlite")
    # find what the tiny model says greedily, to stop on it
    probe_db = str(tmp_path / "probe.sqlite")
    _, _ = _record(tiny_llama, probe_db, [[("x", SYSTEM, _greedy(6))]], num_kv_blocks=64)
    store = RunStore(probe_db)
    toks = list(read_engine_run(store, store.list_runs()[0]["id"]).requests[0].output_token_ids)
    text = Tokenizer(tiny_llama).decode(toks[:4])
    waves = [[("tok", SYSTEM, SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[toks[2]])),
              ("str", SYSTEM, SamplingParams(max_tokens=6, temperature=0, stop=[text[-2:]]))
              if text[-2:].strip() else ("str", SYSTEM, _greedy(3))],
             [("other", SYSTEM[:24] + [9] * 8, _greedy(4))]]
    run_id, cached = _record(tiny_llama, db, waves, num_kv_blocks=64)
    _compare(db, run_id, cached)
