"""The requests the OpenAI-body differential sends to both servers, and a raw HTTP probe.

Each case is sent to vLLM first (every answer read), then to kvscope: never both busy.
``probe`` returns, per case, ``(status, headers, body)`` with ``body`` the JSON object, the
list of a stream's JSON chunks (``[DONE]`` dropped), or the raw text of a non-JSON answer.
Run as a script to dump a vLLM's (or kvscope's) answers: ``python -m tests.vllm.openai_cases URL``.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from bench.vllm_servers import MODEL_NAME

PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
GREEDY = {"model": MODEL_NAME, "temperature": 0, "ignore_eos": True}

# name -> (path, body, content type); a body of bytes is sent as it is
CASES: dict[str, tuple[str, object, str]] = {
    "completion": ("/v1/completions", {**GREEDY, "prompt": PROMPT, "max_tokens": 5}, "application/json"),
    "completion_n2_logprobs_token_ids": ("/v1/completions", {
        **GREEDY, "temperature": 1.0, "seed": 0, "prompt": [PROMPT, "Paged attention"],
        "max_tokens": 4, "n": 2, "logprobs": 2, "return_token_ids": True}, "application/json"),
    "completion_stream_plain": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 3, "stream": True}, "application/json"),
    "completion_stream_n2_usage": ("/v1/completions", {
        **GREEDY, "temperature": 1.0, "seed": 0, "prompt": PROMPT, "max_tokens": 2, "n": 2,
        "stream": True, "stream_options": {"include_usage": True}}, "application/json"),
    "completion_echo_logprobs": ("/v1/completions", {
        **GREEDY, "prompt": [504, 3575, 282, 4649, 314], "max_tokens": 1, "logprobs": 1,
        "echo": True}, "application/json"),
    "completion_echo_only": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 0, "logprobs": 0, "echo": True}, "application/json"),
    "completion_prompt_logprobs": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 2}, "application/json"),
    "completion_prompt_logprobs_0": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 0}, "application/json"),
    "completion_stream": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 4, "logprobs": 1, "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "application/json"),
    "completion_truncated": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 3, "truncate_prompt_tokens": 3,
        "return_token_ids": True}, "application/json"),
    "completion_allowed_bias": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "max_tokens": 4, "allowed_token_ids": [260, 314, 3575, 4649],
        "logit_bias": {"260": 5.0}, "return_token_ids": True}, "application/json"),
    "completion_empty_model": ("/v1/completions", {
        **GREEDY, "model": "", "prompt": PROMPT, "max_tokens": 2}, "application/json"),
    "chat": ("/v1/chat/completions", {**GREEDY, "messages": CHAT, "max_tokens": 5}, "application/json"),
    "chat_n2_logprobs_token_ids": ("/v1/chat/completions", {
        **GREEDY, "temperature": 1.0, "seed": 0, "messages": CHAT, "max_tokens": 3, "n": 2,
        "logprobs": True, "top_logprobs": 2, "return_token_ids": True, "prompt_logprobs": 1},
        "application/json"),
    "chat_stream_plain": ("/v1/chat/completions", {
        **GREEDY, "messages": CHAT, "max_tokens": 3, "stream": True}, "application/json"),
    "chat_developer": ("/v1/chat/completions", {
        **GREEDY, "messages": [{"role": "developer", "content": "Answer in French."},
                               {"role": "user", "content": "Hello"}], "max_tokens": 4},
        "application/json"),
    "chat_stream": ("/v1/chat/completions", {
        **GREEDY, "messages": CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 1,
        "stream": True, "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "application/json"),
    "error_temperature": ("/v1/completions", {**GREEDY, "prompt": PROMPT, "temperature": -1},
                          "application/json"),
    "error_model": ("/v1/completions", {**GREEDY, "model": "nope", "prompt": PROMPT}, "application/json"),
    "error_stop_token_ids": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "stop_token_ids": [10 ** 6]}, "application/json"),
    "error_truncate": ("/v1/completions", {
        **GREEDY, "prompt": PROMPT, "truncate_prompt_tokens": 10 ** 5}, "application/json"),
    "error_chat_logprobs": ("/v1/chat/completions", {
        **GREEDY, "messages": CHAT, "top_logprobs": 2}, "application/json"),
    "error_content_type": ("/v1/completions", json.dumps({**GREEDY, "prompt": PROMPT}).encode(),
                           "text/plain"),
    "health": ("/health", None, ""),
}


def send(base_url: str, path: str, body, content_type: str, timeout: float = 300):
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(base_url + path, data=data, headers=headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    text = raw.decode()
    if text.startswith("data: "):
        chunks = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
        return status, hdrs, [json.loads(c) for c in chunks if c != "[DONE]"]
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def probe(base_url: str, cases: dict = CASES) -> dict[str, tuple[int, dict, object]]:
    return {name: send(base_url, *case) for name, case in cases.items()}


if __name__ == "__main__":
    out = {k: (s, b) for k, (s, _, b) in probe(sys.argv[1]).items()}
    json.dump(out, sys.stdout, indent=1)
