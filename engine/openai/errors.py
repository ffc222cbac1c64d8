"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Status codes, and the ``type`` and ``code`` each carries (as api.openai.com uses them
where it has the case; vLLM since #22099 uses the same envelope):
- 400 ``invalid_request_error``: a bad parameter (``param`` names it, ``code``
  ``invalid_value``), or a prompt that does not fit (``context_length_exceeded``);
- 401 ``invalid_request_error`` / ``invalid_api_key``: the server token is missing or wrong;
- 403 ``invalid_request_error`` / ``origin_not_allowed``: a browser page from elsewhere;
- 404 ``invalid_request_error`` / ``model_not_found`` (or ``not_found`` for a path);
- 413 ``invalid_request_error`` / ``request_too_large``;
- 429 ``rate_limit_error`` / ``queue_full`` or ``busy``: the engine's waiting queue (or
  its command queue) is full; retry later;
- 500 ``server_error`` / ``internal``; 503 ``server_error`` / ``loading`` or ``shutting_down``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.sampling_params import SamplingParams
from engine.protocol.errors import ErrorCode as E
from engine.protocol.errors import ProtocolError
from engine.protocol.messages import Error

INVALID = "invalid_request_error"


@dataclass(eq=False)  # not frozen: Python sets __traceback__ & co. on exceptions
class ApiError(Exception):
    status: int
    message: str
    type: str = INVALID
    param: str | None = None
    code: str | None = "invalid_value"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400 for an invalid parameter."""
    return ApiError(400, message, INVALID, param, code)


# The engine thread's error codes (protocol v2) as HTTP errors.
_FROM_ENGINE = {
    E.PROMPT_TOO_LONG: (400, INVALID, "context_length_exceeded"),
    E.PROMPT_TOO_LARGE: (400, INVALID, "context_length_exceeded"),  # too many bytes to fit
    E.EMPTY_PROMPT: (400, INVALID, "empty_prompt"),
    E.BAD_PARAMS: (400, INVALID, "invalid_value"),
    E.BAD_REQUEST: (400, INVALID, "invalid_value"),
    E.DUPLICATE_REQUEST_ID: (400, INVALID, "duplicate_request_id"),
    E.TOO_MANY_IN_FLIGHT: (429, "rate_limit_error", "too_many_in_flight"),
    E.QUEUE_FULL: (429, "rate_limit_error", "queue_full"),
    E.BUSY: (429, "rate_limit_error", "busy"),
    E.SHUTTING_DOWN: (503, "server_error", "shutting_down"),
    E.INTERNAL: (500, "server_error", "internal"),
}


def from_engine(err: Error | ProtocolError) -> ApiError:
    """The HTTP error for an ``error`` reply of the engine thread (or a refusal of the
    front door), naming the parameter where it can: the prompt that does not fit, or the
    sampling field a check at admission refused (``top_k`` above the vocabulary;
    SamplingParams' messages start with the field)."""
    status, kind, code = _FROM_ENGINE.get(err.code, (500, "server_error", err.code))
    param = None
    if err.code in (E.PROMPT_TOO_LONG, E.PROMPT_TOO_LARGE):
        param = "prompt"
    elif err.code == E.BAD_PARAMS:
        word = err.message.split(" ", 1)[0]
        param = word if word in SamplingParams.__dataclass_fields__ else None
    return ApiError(status, err.message, kind, param, code)
