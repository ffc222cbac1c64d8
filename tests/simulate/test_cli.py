"""``kvscope simulate`` as a user runs it: the shipped trace, a fleet, --json, --record."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.cli import main
from engine.store.runs import RunStore
from tests.simulate.test_traces import SHIPPED

COST = ["--step-cost", "0.005,0.00002,0.0005,0.0000001"]


def test_a_fleet_run_prints_vllm_counters_overall_and_per_pod(capsys):
    rc = main(["simulate", str(SHIPPED), "--pods", "4", "--router", "precise-prefix",
               "--num-kv-blocks", "1200", "--max-num-batched-tokens", "2048", "--json", *COST])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_blocks_stored",
                "num_blocks_evicted", "reachable_hit_rate", "achieved_hit_rate", "router_loss", "ttft_s"):
        assert key in s
    assert s["num_requests"] == 300 and len(s["pods"]) == 4
    assert sum(p["num_requests"] for p in s["pods"]) == 300
    assert sum(p["prefix_cache_hits"] for p in s["pods"]) == s["prefix_cache_hits"]
    assert s["prefix_cache_queries"] == s["prompt_tokens"]  # nothing preempted: every lookup a first one
    assert 0 < s["prefix_cache_hits"] and s["achieved_hit_rate"] <= s["reachable_hit_rate"] + 1e-9
    assert s["achieved_hit_rate"] == s["prefix_cache_hits"] / s["prefix_cache_queries"]


def test_routers_rank_as_they_should_on_the_shipped_trace(capsys):
    rates = {}
    for router in ("round-robin", "precise-prefix", "oracle"):
        main(["simulate", str(SHIPPED), "--pods", "4", "--router", router, "--num-kv-blocks", "1200",
              "--max-num-batched-tokens", "2048", "--json", *COST])
        rates[router] = json.loads(capsys.readouterr().out)["prefix_cache_hit_rate"]
    assert rates["round-robin"] < rates["precise-prefix"] <= rates["oracle"] + 0.01


def test_recorded_pods_are_simulated_runs_that_replay_to_the_pods_true_state(tmp_path, capsys):
    from engine.core import CacheConfig, SchedulerConfig
    from engine.simulate.cost import StepCost
    from engine.simulate.simulation import SimConfig, simulate
    from engine.simulate.trace import read_jsonl
    from engine.store.recorder import Recorder

    db = str(tmp_path / "runs.sqlite")
    trace = read_jsonl(SHIPPED)
    trace = dataclasses.replace(trace, requests=trace.requests[:60])
    cfg = SimConfig(2, "round-robin", SchedulerConfig(max_model_len=16384, max_num_batched_tokens=1024),
                    CacheConfig(block_size=16, num_blocks=1100), StepCost(0.005, 2e-5, 5e-4, 0.0))
    rec = Recorder(db)
    result = simulate(trace, cfg, recorder=rec, label="t")
    rec.close()
    store = RunStore(db)
    runs = {r["id"]: r for r in store.list_runs()}
    assert set(result.run_ids) == set(runs) and all(runs[r]["kind"] == "simulated" for r in runs)
    for pod, rid in zip(result.pods, result.run_ids):
        state = store.state_at(rid)
        truth = pod.scheduler.snapshot()
        assert dataclasses.replace(state.to_snapshot(), step=truth.step) == truth
        assert len(store.load_requests(rid)) == sum(1 for t in result.requests if t.pod == pod.index)
    assert main(["runs", "--db", db]) == 0
    assert "t pod 0/2" in capsys.readouterr().out


def test_bad_settings_are_one_clear_line(capsys, tmp_path):
    assert main(["simulate", str(SHIPPED), "--num-kv-blocks", "10", *COST]) == 1
    assert "max_model_len" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "missing.jsonl"), "--num-kv-blocks", "10",
                 "--db", str(tmp_path / "x.sqlite"), *COST]) == 1
    assert "neither a trace file nor a recorded run" in capsys.readouterr().err
    assert main(["simulate", str(SHIPPED), *COST]) == 1
    assert "--num-kv-blocks" in capsys.readouterr().err
    assert main(["simulate", str(SHIPPED), "--num-kv-blocks", "2000", "--sweep", "colour=1,2", *COST]) == 1
    assert "NAME one of" in capsys.readouterr().err


def test_a_sweep_prints_a_row_per_combination_and_draws_the_capacity_curve(tmp_path, capsys):
    fig = tmp_path / "cap.json"
    rc = main(["simulate", str(SHIPPED), "--pods", "2", "--num-kv-blocks", "1100",
               "--max-num-batched-tokens", "2048", "--sweep", "num_kv_blocks=1100,3000",
               "--sweep", "router=round-robin,oracle", "--json", "--figure", str(fig), *COST])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["num_kv_blocks"], r["router"]) for r in rows] == [
        (1100, "round-robin"), (1100, "oracle"), (3000, "round-robin"), (3000, "oracle")]
    by = {(r["num_kv_blocks"], r["router"]): r["prefix_cache_hit_rate"] for r in rows}
    assert by[(3000, "oracle")] >= by[(1100, "oracle")] and by[(3000, "oracle")] >= by[(3000, "round-robin")]
    figure = json.loads(fig.read_text())
    names = [t["name"] for t in figure["data"]]
    assert names == ["round-robin", "oracle"]
    assert figure["data"][1]["y"] == [100 * by[(1100, "oracle")], 100 * by[(3000, "oracle")]]


def test_a_sweep_in_two_processes_gives_the_serial_sweeps_rows_and_each_runs_own_figures():
    """``run_sweep(workers=2)``: forked workers, the same rows byte for byte as one process,
    and each row's figures those of a run of its own (with the miss-cause book, prompt
    hashes not shared): the sweep's shortcuts change nothing it reports."""
    from engine.cli import build_parser
    from engine.simulate.commands import build_config, load_trace
    from engine.simulate.report import summarize
    from engine.simulate.simulation import simulate
    from engine.simulate.sweep import _with, run_sweep

    args = build_parser().parse_args(["simulate", str(SHIPPED), "--pods", "2", "--num-kv-blocks", "1100",
                                      "--max-num-batched-tokens", "2048", *COST])
    trace = load_trace(args.trace, None, None)
    base = build_config(args, trace)
    sweeps = {"num_kv_blocks": [1100, 3000], "router": ["round-robin", "precise-prefix", "oracle"]}
    serial, seen = run_sweep(trace, base, sweeps), []
    parallel = run_sweep(trace, base, sweeps, progress=seen.append, workers=2)
    assert json.dumps(parallel) == json.dumps(serial) and seen == parallel and len(serial) == 6
    for row in serial:
        s = summarize(simulate(trace, _with(_with(base, "num_kv_blocks", row["num_kv_blocks"]),
                                            "router", row["router"])))
        assert (row["prefix_cache_hit_rate"], row["reachable_hit_rate"], row["num_blocks_evicted"],
                row["num_preemptions"], row["ttft_p50_s"], row["num_steps"]) == (
            s["prefix_cache_hit_rate"], s["reachable_hit_rate"], s["num_blocks_evicted"],
            s["num_preemptions"], s["ttft_s"]["p50"], s["num_steps"])
    assert any(r["num_blocks_evicted"] > 0 for r in serial)


def test_recording_sampled_pods_keeps_exactly_those_pods_and_says_so(tmp_path):
    """``record_pods``: runs for those pods only, every step of theirs (they replay to the
    pod's true state), none of the others' events; the fleet decides as when all are
    recorded, and each run's config and label say which pods were kept."""
    from engine.core import CacheConfig, SchedulerConfig
    from engine.simulate.cost import StepCost
    from engine.simulate.report import summarize
    from engine.simulate.simulation import SimConfig, simulate
    from engine.simulate.trace import read_jsonl
    from engine.store.recorder import Recorder
    from dashboard.views.replay import simulated_note

    trace = read_jsonl(SHIPPED)
    trace = dataclasses.replace(trace, requests=trace.requests[:60])
    cfg = SimConfig(4, "least-loaded", SchedulerConfig(max_model_len=16384, max_num_batched_tokens=1024),
                    CacheConfig(block_size=16, num_blocks=1100), StepCost(0.005, 2e-5, 5e-4, 0.0),
                    record_pods=(3, 1))
    results = {}
    for name, c in (("some", cfg), ("all", dataclasses.replace(cfg, record_pods=None))):
        rec = Recorder(str(tmp_path / f"{name}.sqlite"))
        results[name] = simulate(trace, c, recorder=rec, label="t")
        rec.close()
    some, every = results["some"], results["all"]
    assert len(some.run_ids) == 2 and len(every.run_ids) == 4
    a, b = summarize(some), summarize(every)
    a.pop("run_ids"), b.pop("run_ids")
    assert a == b and [dataclasses.astuple(t) for t in some.requests] == [dataclasses.astuple(t) for t in every.requests]
    assert [p.log.enabled for p in some.pods] == [False, True, False, True]
    store = RunStore(str(tmp_path / "some.sqlite"))
    runs = {r["id"]: r for r in store.list_runs()}
    for pod, rid in zip((some.pods[1], some.pods[3]), some.run_ids):
        run = runs[rid]
        assert run["label"] == f"t pod {pod.index}/4 (recorded: pods 1, 3 of 4)"
        sim = run["config"]["simulated"]
        assert (sim["pod"], sim["recorded_pods"]) == (pod.index, [1, 3])
        assert "Only pods 1, 3 of the 4 were recorded" in simulated_note(sim)
        assert len(store.load_steps(rid)) == pod.num_steps > 0
        truth = pod.scheduler.snapshot()
        assert dataclasses.replace(store.state_at(rid).to_snapshot(), step=truth.step) == truth
        assert len(store.load_requests(rid)) == sum(1 for t in some.requests if t.pod == pod.index)
    assert sum(1 for t in some.requests if t.pod in (0, 2)) > 0  # the others served requests
    with __import__("pytest").raises(ValueError, match="pod numbers 0..3"):
        dataclasses.replace(cfg, record_pods=(4,))


def test_miss_causes_are_asked_for_or_recorded_and_change_no_other_figure(capsys, tmp_path):
    args = ["simulate", str(SHIPPED), "--pods", "2", "--router", "precise-prefix", "--num-kv-blocks", "1100",
            "--max-num-batched-tokens", "2048", "--json", *COST]
    assert main(args) == 0
    bare = json.loads(capsys.readouterr().out)
    assert main(args + ["--miss-causes"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["prefix_cache_miss_evicted"] > 0 and bare["prefix_cache_miss_evicted"] is None
    assert bare["notes"] and "pass --miss-causes" in bare["notes"][0] and full["notes"] == []
    for k in ("prefix_cache_hits", "prefix_cache_queries", "num_blocks_evicted", "num_preemptions", "ttft_s"):
        assert bare[k] == full[k]
    # a recording keeps the book without being asked (its events carry the causes)
    assert main(args + ["--record", "--db", str(tmp_path / "x.sqlite")]) == 0
    recorded = json.loads(capsys.readouterr().out)
    assert recorded["notes"] == []
    for k in ("prefix_cache_miss_cold", "prefix_cache_miss_evicted", "prefix_cache_miss_partial"):
        assert recorded[k] == full[k]
    text = [a for a in args if a != "--json"]
    assert main(text + ["--miss-causes"]) == 0
    assert (f"missed tokens: cold {full['prefix_cache_miss_cold']}, evicted {full['prefix_cache_miss_evicted']}, "
            f"partial {full['prefix_cache_miss_partial']}") in capsys.readouterr().out
    assert main(text) == 0
    out = capsys.readouterr().out
    assert "missed tokens" not in out and "pass --miss-causes" in out


def test_a_sweep_makes_each_prompt_once_and_its_runs_read_those_tokens_and_hashes(monkeypatch):
    """``SharedPrompts``: each request's tokens made once, its hashes once per block size
    (here 16 and 32, the sweep's), before any run; a run given them reports what a run
    making its own does, to the per-request time."""
    import dataclasses

    from engine.core.hashing import get_hasher
    from engine.simulate import simulation
    from engine.simulate.simulation import SharedPrompts, simulate
    from engine.simulate.trace import read_jsonl

    trace = read_jsonl(SHIPPED)
    made = []
    monkeypatch.setattr(simulation.TracedRequest, "tokens",
                        lambda tr, _orig=simulation.TracedRequest.tokens: made.append(tr) or _orig(tr))
    base = _cli_config(trace)
    cfgs = [dataclasses.replace(base, cache=dataclasses.replace(base.cache, block_size=bs), router=r)
            for bs in (16, 32) for r in ("round-robin", "oracle")]
    shared = SharedPrompts(trace).prepare(cfgs)
    assert len(made) == len(trace.requests) and sorted(shared.hashes) == [(16, "sha256"), (32, "sha256")]
    toks = shared.tokens[7]
    assert shared.hashes[(32, "sha256")][7] == tuple(get_hasher("sha256").full_blocks(toks, 32, [])[:(len(toks) - 1) // 32])
    for cfg in cfgs:
        with_shared = simulate(trace, cfg, shared=shared)
        assert with_shared.requests == simulate(trace, cfg).requests
    assert len(made) == len(trace.requests) * (1 + len(cfgs))  # the runs without made theirs
    with pytest.raises(ValueError, match="another trace"):
        simulate(dataclasses.replace(trace), cfgs[0], shared=shared)


def _cli_config(trace):
    from engine.cli import build_parser
    from engine.simulate.commands import build_config

    args = build_parser().parse_args(["simulate", str(SHIPPED), "--pods", "2", "--num-kv-blocks", "1100",
                                      "--max-num-batched-tokens", "2048", *COST])
    return build_config(args, trace)
