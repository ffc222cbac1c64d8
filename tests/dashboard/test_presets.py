"""Presets fit the running engine: no prompt too long, forks fork, pressure overflows."""

from __future__ import annotations

import pytest

from dashboard.presets import PRESETS, TEMPLATE_SLACK
from dashboard.settings import load


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
