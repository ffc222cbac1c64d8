"""Error codes of protocol v2, and the exception a refused frame raises.

``ErrorCode`` values are the strings of ``error.code`` on the wire. A
``ProtocolError`` carries one, with the request id and op it belongs to when the
frame named them; the server turns it into an ``Error`` message for the sender
only, and keeps serving.
"""

from __future__ import annotations

from engine.core.errors import EmptyPromptError, PromptTooLongError, QueueFullError, SamplingParamsError


class ErrorCode:
    """Values of ``error.code`` (strings on the wire)."""

    BAD_JSON = "bad_json"                  # not JSON, or not an object
    BINARY_FRAME = "binary_frame"          # the protocol is text frames only
    TOO_LARGE = "too_large"                # frame over --max-frame-bytes
    UNKNOWN_OP = "unknown_op"
    BAD_REQUEST = "bad_request"            # missing/ill-typed fields, bad token ids, ...
    BAD_PARAMS = "bad_params"              # sampling params invalid or out of range
    PROMPT_TOO_LONG = "prompt_too_long"
    PROMPT_TOO_LARGE = "prompt_too_large"  # more bytes than any prompt that fits (not tokenized)
    EMPTY_PROMPT = "empty_prompt"          # no tokens to generate from (or a chat of empty messages)
    QUEUE_FULL = "queue_full"              # the engine's waiting queue is full
    BUSY = "busy"                          # the engine thread's command queue is full
    TOO_MANY_IN_FLIGHT = "too_many_in_flight"  # this connection's in-flight limit
    DUPLICATE_REQUEST_ID = "duplicate_request_id"
    UNKNOWN_REQUEST = "unknown_request"    # abort of a request this connection does not own
    UNKNOWN_RUN = "unknown_run"            # steps_since for a run neither live nor recorded
    BAD_CONFIG = "bad_config"              # restart options rejected; the old engine keeps serving
    RESTART_DISABLED = "restart_disabled"  # the operator turned client restarts off
    SLOW_CLIENT = "slow_client"            # unsent frames past the byte bound; connection closed
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"                  # an engine fault; the request was aborted
    READ_ONLY = "read_only"                # kvscope attach: the engine is someone else's


class ProtocolError(Exception):
    """A frame (or a message) the receiver rejects; the server answers it with ``error``."""

    def __init__(self, code: str, message: str, request_id: str | None = None,
                 op: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.request_id, self.op = code, message, request_id, op


def code_of(exc: Exception) -> str:
    """The ``error.code`` of an engine refusal (the front door's check and the engine's);
    ``bad_request`` for any other error."""
    return (ErrorCode.PROMPT_TOO_LONG if isinstance(exc, PromptTooLongError) else
            ErrorCode.EMPTY_PROMPT if isinstance(exc, EmptyPromptError) else
            ErrorCode.QUEUE_FULL if isinstance(exc, QueueFullError) else
            ErrorCode.BAD_PARAMS if isinstance(exc, SamplingParamsError) else ErrorCode.BAD_REQUEST)
