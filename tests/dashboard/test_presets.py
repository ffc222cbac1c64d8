"""Presets fit the running engine and show their claim in time.

Sizing against a small and the default pool (with the default model's tokenizer when
it is on this machine, else byte bounds); then every preset on a real engine (tiny
model, same pool shapes) must show its effect, and the contiguous baseline of its run
must agree with the paged run step by step while everything fits, and never run more
requests at once on average.
"""

from __future__ import annotations

import pytest

from engine.events.baseline.contiguous import BaselineConfig, Reservation, replay

from dashboard.contiguous import baselines_of_records
from dashboard.preset_effects import effects, verdict
from dashboard.presets import (
    PRESETS, PRESSURE_SLOTS, TEMPLATE_SLACK, TIME_BUDGET_S, Tokens, after_restart,
)
from dashboard.settings import load

SMALL = {"max_model_len": 256, "num_blocks": 256, "block_size": 4, "max_num_seqs": 64,
         "max_num_batched_tokens": 64}
DEFAULT = {"max_model_len": 2048, "num_blocks": 1456, "block_size": 16, "max_num_seqs": 64,
           "max_num_batched_tokens": 512}  # the default model's engine on the CPU box


def _tokens_upper_bound(sub) -> int:
    """Byte-level worst case: one token per UTF-8 byte, plus the template's tokens."""
    text = sub.prompt if sub.prompt is not None else "".join(m["content"] for m in sub.messages)
    return len(text.encode()) + TEMPLATE_SLACK


@pytest.mark.parametrize("config", [
    {"max_model_len": 256, "num_blocks": 256, "block_size": 4, "max_num_seqs": 64},
    {"max_model_len": 2048, "num_blocks": 1450, "block_size": 16, "max_num_seqs": 64},
    {"max_model_len": 64, "num_blocks": 32, "block_size": 4, "max_num_seqs": 4},
    {},
])
def test_every_preset_fits_the_engine(config):
    mml = config.get("max_model_len", 2048)
    for key, build in PRESETS.items():
        w = build(config)
        assert w.size >= 1 and w.watch
        for wave in w.waves:
            for sub in wave:
                prompt = _tokens_upper_bound(sub)
                assert prompt < mml, (key, prompt, mml)  # else the server refuses it
                assert prompt + sub.params["max_tokens"] <= max(mml, prompt + 1), key


def test_preset_shapes():
    cfg = {"max_model_len": 256, "num_blocks": 256, "block_size": 4, "max_num_seqs": 64}
    shared = PRESETS["shared_system_prompt"](cfg)
    assert [len(w) for w in shared.waves] == [1, 7]  # one warms the cache, seven hit it
    systems = {s.messages[0]["content"] for w in shared.waves for s in w}
    assert len(systems) == 1
    assert PRESETS["forks"](cfg).waves[0][0].params["n"] == 4
    burst = PRESETS["memory_pressure"](cfg)
    demand = sum(len(s.prompt) + s.params["max_tokens"] for s in burst.waves[0])
    assert demand > 256 * 4, "the burst asks for more slots than the pool has"
    assert all(s.params.get("ignore_eos") for s in burst.waves[0])


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("KVSCOPE_URL", "127.0.0.1:9999")
    monkeypatch.setenv("KVSCOPE_REFRESH_S", "bogus")
    monkeypatch.setenv("KVSCOPE_SERVE_ARGS", "--block-size 8 --num-kv-blocks 64")
    s = load()
    assert s.url == "ws://127.0.0.1:9999" and s.port == 9999
    assert s.health_url == "http://127.0.0.1:9999/healthz"
    assert s.refresh_s == 0.5 and s.serve_args == ("--block-size", "8", "--num-kv-blocks", "64")


def _counter():
    """The default model's tokenizer (its dequantized copy made once, as the engine's
    first start makes it): the presets are sized with it, as the dashboard sizes them
    with the served model's. Not left to whether an earlier test happened to cache it."""
    from dashboard.token_text import token_counter_for
    from engine.model.gguf_cache import default_gguf_path, ensure_dequantized

    return token_counter_for({"tokenizer_file": str(ensure_dequantized(default_gguf_path()) / "tokenizer.json")})


def _fitted(key, config, tokens):
    """The workload for ``config``, after its restart when it asks for one."""
    w = PRESETS[key](config, tokens)
    if w.restart is None:
        return config, w
    fitted = after_restart(config, w.restart)
    w2 = PRESETS[key](fitted, tokens)
    assert w2.restart is None, (key, w.restart, w2.restart)  # one restart is enough
    return fitted, w2


@pytest.mark.parametrize("config", [SMALL, DEFAULT], ids=["small", "default"])
@pytest.mark.parametrize("key", list(PRESETS))
def test_every_preset_shows_its_effect_in_time_after_at_most_one_restart(key, config):
    tokens = Tokens(_counter())
    fitted, w = _fitted(key, config, tokens)
    assert w.estimate_s <= TIME_BUDGET_S, (key, w.estimate_s)
    assert w.effect and w.rule and w.watch
    if w.effect == "chunked":  # the long prompt: >= 3x the budget the engine will have
        long_prompt = w.waves[-1][0].prompt
        assert tokens.least(long_prompt) >= 3 * fitted["max_num_batched_tokens"]
        assert tokens.most(long_prompt) + w.waves[-1][0].params["max_tokens"] <= fitted["max_model_len"]
        assert all(s.params["max_tokens"] > 3 for s in w.waves[0])  # still decoding
    if w.effect == "pressure":  # more than the pool, the pool one that fills in seconds
        cap = fitted["num_blocks"] * fitted["block_size"]
        demand = sum(tokens.most(s.prompt) + s.params["max_tokens"] for s in w.waves[0])
        assert demand > 1.2 * cap and cap <= PRESSURE_SLOTS
        assert fitted["max_model_len"] <= cap  # else the restart is refused


def test_the_default_pool_is_restarted_small_for_memory_pressure_only():
    tokens = Tokens(_counter())
    for key in PRESETS:
        w = PRESETS[key](DEFAULT, tokens)
        assert (w.restart is not None) == (key == "memory_pressure"), (key, w.restart)
    w = PRESETS["memory_pressure"](DEFAULT, tokens)
    assert w.restart == {"num_kv_blocks": PRESSURE_SLOTS // 16, "max_model_len": PRESSURE_SLOTS,
                         "max_num_seqs": 64}
    assert "minutes" in w.restart_why
    # a budget too big to chunk a 3x prompt inside max_model_len is lowered; a pool
    # without chunked prefill or prefix caching is switched back on
    w = PRESETS["long_with_short"]({**DEFAULT, "max_num_batched_tokens": 2048}, tokens)
    assert w.restart["max_num_batched_tokens"] * 3 < 2048
    assert PRESETS["long_with_short"]({**DEFAULT, "enable_chunked_prefill": False},
                                      tokens).restart["enable_chunked_prefill"] is True
    assert PRESETS["shared_system_prompt"]({**DEFAULT, "enable_prefix_caching": False},
                                           tokens).restart == {"enable_prefix_caching": True}


def _run(engine, workload, name):
    """Submit the waves as the dashboard's runner does; the run's records and ids."""
    from engine.core.sampling_params import SamplingParams

    records, ids = [], []
    engine.step_listeners.append(records.append)
    for wi, wave in enumerate(workload.waves):
        mine = [engine.add_request(prompt=s.prompt, messages=s.messages,
                                   params=SamplingParams.from_dict(s.params),
                                   request_id=f"{name}-{wi}-{j}") for j, s in enumerate(wave)]
        ids += mine
        if wi + 1 < len(workload.waves):  # the next wave once these have a first token
            started: set[str] = set()
            while not set(mine) <= started:
                started |= {o.request_id for o in engine.step()
                            if o.finished or any(c.token_ids for c in o.outputs)}
    while engine.has_unfinished_requests():
        engine.step()
    return records, ids


@pytest.mark.parametrize("config", [SMALL, DEFAULT], ids=["small", "default"])
def test_presets_on_a_real_engine_show_their_effect_and_paged_runs_at_least_as_many(config, tiny_model):
    from engine.config import EngineConfig
    from engine.llm_engine import build_engine

    from dashboard.token_text import token_counter_for

    opts = {"num_kv_blocks": config["num_blocks"], "block_size": config["block_size"],
            # the tiny model has 512 positions, and an engine refuses a longer max_model_len
            "max_model_len": min(config["max_model_len"], 512), "max_num_seqs": config["max_num_seqs"],
            "max_num_batched_tokens": config["max_num_batched_tokens"]}
    first = build_engine(EngineConfig(model=tiny_model, **opts))
    tokens = Tokens(token_counter_for(first.describe()))
    for key in PRESETS:
        w = PRESETS[key](first.describe(), tokens)
        engine = first
        if w.restart is not None:  # what the preset's one-click restart does
            engine = build_engine(EngineConfig(**{**first.config.to_dict(), **w.restart}),
                                  loaded=first.engine_core.loaded)
            w = PRESETS[key](engine.describe(), tokens)
            assert w.restart is None
        records, ids = _run(engine, w, key)
        fx = effects(records, ids)
        shown, words = verdict(w.effect, fx)
        assert shown and fx.done, (key, words)
        d = engine.describe()
        max_tokens = {r: s.params["max_tokens"] for r, s in
                      zip(ids, [s for wave in w.waves for s in wave])}
        base = baselines_of_records(records, d["num_blocks"], d["block_size"],
                                    d["max_model_len"], max_tokens)
        s = base.summaries()
        for v in ("max_model_len", "prompt_plus_max_tokens"):
            assert s["paged"]["mean_concurrency"] >= s[v]["mean_concurrency"], (key, v, s)
            assert s["paged"]["num_steps"] <= s[v]["num_steps"], (key, v)
        # with room for every reservation at once nothing waits: the same, step by step
        roomy = replay(records, BaselineConfig(10 ** 9, d["max_model_len"],
                                               Reservation.MAX_MODEL_LEN), max_tokens)
        assert [(r.step, r.num_running, r.num_waiting) for r in roomy.steps] == [
            (r.step, r.num_running, r.num_waiting) for r in base.paged], key
        engine.step_listeners.clear()
