"""Does a prompt, with the tokens asked for, fit ``max_model_len``? vLLM's answer, in its words.

vLLM's OpenAI server refuses (400, ``VLLMValidationError``) a prompt of ``max_model_len``
tokens or more, and an explicit ``max_tokens`` (or chat's ``max_completion_tokens``) that
does not fit beside the prompt; an absent one is clamped to what is left (``get_max_tokens``;
kvscope's engine stops at ``max_model_len`` with ``length``, the same thing). Clients parse
these sentences to shrink their budget and retry (agent frameworks match "'max_tokens' or
'max_completion_tokens' is too large: N. This model's maximum context length is L tokens
and your request has P input tokens"), so they are vLLM's word for word, with its
``(parameter=..., value=...)`` tail. The prompt one adds by how much it is over.
"""

from __future__ import annotations

from engine.openai.errors import ApiError

CODE = "context_length_exceeded"  # api.openai.com's code for both cases


def check_fits(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """Raise the 400 vLLM gives, or return: the request fits."""
    if prompt_tokens >= max_model_len:
        over = prompt_tokens - max_model_len + 1
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, your request has {prompt_tokens} input tokens. Please "
                            f"reduce the length of the input messages. It is {over} token"
                            f"{'s' if over > 1 else ''} too long: room is needed for at least "
                            f"one generated token. (parameter=input_tokens, value={prompt_tokens})",
                       param="input_tokens", code=CODE)
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. "
                            f"This model's maximum context length is {max_model_len} tokens and "
                            f"your request has {prompt_tokens} input tokens ({max_tokens} > "
                            f"{max_model_len} - {prompt_tokens}). (parameter=max_tokens, "
                            f"value={max_tokens})", param="max_tokens", code=CODE)
