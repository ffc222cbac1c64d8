"""Issue 17, "errors for odd inputs": each gets a clear error and the server keeps
serving. On main at 7416b2c ``stop`` as a dict was accepted (its keys became stop
strings), chat roles were passed into the template unchecked (see test_prompt_prep),
and a ``max_model_len`` past the model's positions was only a warning at startup."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import ConfigError, SamplingParams, SamplingParamsError
from tests.server.helpers import GREEDY, raw, recv_until, send


def test_stop_must_be_a_list_or_a_string():
    for bad in ({"stop": {"a": 1}}, {"stop": 5}, {"stop_token_ids": {"1": 2}}, {"stop_token_ids": "12"}):
        with pytest.raises(SamplingParamsError, match="must be a list"):
            SamplingParams.from_dict(bad)
    assert SamplingParams(stop="x").stop == ["x"] and SamplingParams(stop=("x", "y")).stop == ["x", "y"]


def test_max_model_len_past_the_models_positions_is_refused_at_startup(tiny_llama):
    from engine.llm_engine import build_engine

    with pytest.raises(ConfigError, match="exceeds the model's 512 positions"):
        build_engine(EngineConfig(model=tiny_llama, max_model_len=513, num_kv_blocks=256))


def test_deep_json_and_a_dict_stop_over_a_real_socket(make_server):
    # 100k-deep nesting once escaped as RecursionError (close 1011 and a traceback)
    server = make_server()
    ws = raw(server.url)
    ws.send("[" * 100_000 + "]" * 100_000)
    err, _ = recv_until(ws, lambda m: m["type"] == "error", 10)
    assert err["code"] == "bad_json"
    send(ws, type="submit", prompt="x", params={"stop": {"a": 1}}, request_id="d")
    err, _ = recv_until(ws, lambda m: m["type"] == "error", 10)
    assert (err["code"], err["request_id"]) == ("bad_params", "d") and "stop" in err["message"]
    send(ws, type="submit", prompt="still", params=GREEDY, request_id="ok")
    fin, _ = recv_until(ws, lambda m: m["type"] == "finished", 10)
    assert fin["outputs"][0]["finish_reason"] == "length"
    ws.close()
