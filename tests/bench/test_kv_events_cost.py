"""Smoke test of bench/kv_events_cost.py on the tiny model: both modes ran, every batch
reached the subscriber process. Timings are not checked (shared CI machine)."""

from __future__ import annotations

import math

from bench import workloads as W
from bench.kv_events_cost import render, run_kv_events_ab
from engine.model.loader import load_model
from tests.bench.test_bench_smoke import TINY


def test_kv_events_cost_runs_both_modes_and_delivers(tiny_llama):
    loaded = load_model(tiny_llama, device="cpu")
    wl = W.build("shared_prefix", loaded.tokenizer, TINY, 0)
    r = run_kv_events_ab(loaded, tiny_llama, wl, 4, 128, repeats=2, control_passes=1,
                         block_size=4, max_model_len=128)
    assert abs(r["steps"]["off"] - r["steps"]["on"]) <= 2 and r["pairs"] > 0
    # losses are timing ratios: finite, but any value on a loaded machine (not checked)
    assert len(r["loss_engine_thread_per_pass"]) == 2 and math.isfinite(r["loss"])
    assert r["batches_published"] > 0 and r["dropped_steps"] == 0
    # the subscriber joins before the run, so it gets every batch of the run
    assert r["batches_received"] == r["batches_published"] and r["payload_bytes"] > 0
    assert r["control_passes"] == 1 and math.isfinite(r["control_loss_engine_thread"])
    assert "loss" in render(r) and "Control: 1 A/A" in render(r)
