"""Wire format of protocol v2: client ops in, server messages out (JSON text frames).

Pure Python (no torch), shared by the server and the clients.

Client → server (one JSON object per text frame; the op name is in ``type``, or
in ``op`` for convenience):
- ``submit{prompt | messages, params?, request_id?}``: ``prompt`` is text or a
  list of token ids, ``messages`` a chat [{role, content}]; ``params`` are
  SamplingParams fields (unknown keys are an error). Without a ``request_id``
  the server names it. Answer: ``accepted``, then ``output``s, then ``finished``
  (only to this connection); or ``error`` with the request id.
- ``abort{request_id}``: only the submitting connection may abort; the request
  then ends with ``finished`` (finish_reason ``abort``).
- ``snapshot`` → ``snapshot``; ``reset_prefix_cache`` → ``ok``; ``ping`` → ``pong``.
- ``restart{engine: {...}}`` with keys from ``RESTART_KEYS`` only → every client
  gets ``hello`` + ``snapshot`` of the new run, the asker then ``ok``. Live
  requests of the old engine end with ``finished`` (abort).

Server → client: the ``Message`` dataclasses below, each ``{"type": ..., **fields}``:
``hello{protocol, run_id, config, limits}``, ``snapshot{seq, state, metrics}``,
``step{seq, step, ts, events, metrics}``, ``accepted{request_id}``,
``output{request_id, index, text_delta, token_ids}``,
``finished{request_id, outputs, metrics}``, ``error{code, message, request_id?, op?}``,
``ok{op, result}``, ``pong{ts}``.

Ordering: on connect, ``hello`` then ``snapshot``. A client applies the ``step``
messages whose ``seq`` is greater than the last snapshot's ``seq`` (older ones
are already in it). ``seq`` grows by one per step; a gap means the server
dropped steps because this client read too slowly: send ``snapshot`` and
re-base. A new ``hello`` means a new run (restart): ``seq`` starts again at 0
after the ``snapshot`` (seq -1) that follows it. An idle engine sends nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from engine.events.types import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION", "ErrorCode", "ProtocolError", "parse_op", "encode", "RESTART_KEYS"]

MAX_REQUEST_ID_LEN = 128  # ids land in SQLite keys and log lines; longer ones are a mistake

# Engine options a client may change with ``restart``: pool and scheduler shape only.
# The model, device and anything touching files stay as the operator started them.
RESTART_KEYS = ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs",
                "max_model_len", "enable_prefix_caching", "enable_chunked_prefill")


class ErrorCode:
    """Values of ``error.code`` (strings on the wire)."""

    BAD_JSON = "bad_json"                  # not JSON, or not an object
    BINARY_FRAME = "binary_frame"          # the protocol is text frames only
    TOO_LARGE = "too_large"                # frame over --max-frame-bytes
    UNKNOWN_OP = "unknown_op"
    BAD_REQUEST = "bad_request"            # missing/ill-typed fields, bad token ids, ...
    BAD_PARAMS = "bad_params"              # sampling params invalid or out of range
    PROMPT_TOO_LONG = "prompt_too_long"
    QUEUE_FULL = "queue_full"              # the engine's waiting queue is full
    BUSY = "busy"                          # the engine thread's command queue is full
    TOO_MANY_IN_FLIGHT = "too_many_in_flight"  # this connection's in-flight limit
    DUPLICATE_REQUEST_ID = "duplicate_request_id"
    UNKNOWN_REQUEST = "unknown_request"    # abort of a request this connection does not own
    BAD_CONFIG = "bad_config"              # restart options rejected; the old engine keeps serving
    SLOW_CLIENT = "slow_client"            # replies piled up past the bound; connection closed
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"                  # an engine fault; the request was aborted


class ProtocolError(Exception):
    """A client frame the server rejects; becomes an ``error`` message."""

    def __init__(self, code: str, message: str, request_id: str | None = None,
                 op: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.request_id, self.op = code, message, request_id, op


def _shallow(obj: Any) -> dict[str, Any]:
    # Not dataclasses.asdict: that deep-copies, and a snapshot's state is big.
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


# ---- client ops (parsed on the event-loop thread) ----------------------------

@dataclass(frozen=True, slots=True)
class Op:
    type: ClassVar[str] = "op"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **{k: v for k, v in _shallow(self).items() if v is not None}}


@dataclass(frozen=True, slots=True)
class SubmitOp(Op):
    type: ClassVar[str] = "submit"
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class AbortOp(Op):
    type: ClassVar[str] = "abort"
    request_id: str


@dataclass(frozen=True, slots=True)
class SnapshotOp(Op):
    type: ClassVar[str] = "snapshot"


@dataclass(frozen=True, slots=True)
class ResetPrefixCacheOp(Op):
    type: ClassVar[str] = "reset_prefix_cache"


@dataclass(frozen=True, slots=True)
class PingOp(Op):
    type: ClassVar[str] = "ping"


@dataclass(frozen=True, slots=True)
class RestartOp(Op):
    type: ClassVar[str] = "restart"
    engine: dict[str, Any] = field(default_factory=dict)


_OPS = {cls.type: cls for cls in (SubmitOp, AbortOp, SnapshotOp, ResetPrefixCacheOp, PingOp,
                                  RestartOp)}


def _request_id(d: dict, required: bool, op: str) -> str | None:
    rid = d.get("request_id")
    if rid is None and not required:
        return None
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_REQUEST_ID_LEN or "#" in rid:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"request_id must be a string of 1..{MAX_REQUEST_ID_LEN} "
                            f"characters without '#', got {rid!r}", op=op)
    return rid


def _submit(d: dict) -> SubmitOp:
    rid = _request_id(d, False, "submit")

    def bad(msg: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_REQUEST, msg, rid, "submit")

    prompt, messages, params = d.get("prompt"), d.get("messages"), d.get("params")
    if (prompt is None) == (messages is None):
        raise bad("submit needs exactly one of 'prompt' (text or token ids) and 'messages' (a chat)")
    if prompt is not None and not isinstance(prompt, str) and not (
            isinstance(prompt, list) and all(type(t) is int for t in prompt)):
        raise bad("prompt must be a string or a list of integer token ids")
    if messages is not None and not (
            isinstance(messages, list) and messages
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in messages)):
        raise bad("messages must be a non-empty list of {'role': str, 'content': str}")
    if params is not None and not isinstance(params, dict):
        raise ProtocolError(ErrorCode.BAD_PARAMS, "params must be an object of sampling parameters",
                            rid, "submit")
    unknown = set(d) - {"type", "op", "prompt", "messages", "params", "request_id"}
    if unknown:
        raise bad(f"unknown submit field(s): {sorted(unknown)}")
    return SubmitOp(prompt=prompt, messages=messages, params=params or {}, request_id=rid)


def _restart(d: dict) -> RestartOp:
    opts = d.get("engine", {})
    if not isinstance(opts, dict):
        raise ProtocolError(ErrorCode.BAD_CONFIG, "restart needs 'engine': an object of engine options",
                            op="restart")
    unknown = set(opts) - set(RESTART_KEYS)
    if unknown:
        raise ProtocolError(ErrorCode.BAD_CONFIG, f"restart cannot change {sorted(unknown)}; "
                            f"allowed: {list(RESTART_KEYS)}", op="restart")
    return RestartOp(engine=dict(opts))


def parse_op(frame: str) -> Op:
    """Parse one text frame into a typed op; raises ProtocolError with the reason."""
    try:
        d = json.loads(frame)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"frame is not valid JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "a frame must be a JSON object with a 'type' field")
    name = d.get("type", d.get("op"))
    cls = _OPS.get(name) if isinstance(name, str) else None
    if cls is None:
        rid = d.get("request_id") if isinstance(d.get("request_id"), str) else None
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {name!r}; expected one of {sorted(_OPS)}",
                            rid)
    if cls is SubmitOp:
        return _submit(d)
    if cls is RestartOp:
        return _restart(d)
    if cls is AbortOp:
        return AbortOp(request_id=_request_id(d, True, "abort"))
    return cls()


# ---- server messages -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Message:
    type: ClassVar[str] = "message"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **_shallow(self)}


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """First message of a connection, and again after every restart (a new run)."""

    type: ClassVar[str] = "hello"
    protocol: int
    run_id: str | None
    config: dict[str, Any]
    limits: dict[str, Any] = field(default_factory=dict)  # this server's bounds (see app)


@dataclass(frozen=True, slots=True)
class Snapshot(Message):
    """The pool state after step message ``seq`` (-1: before any step of this run),
    and the metrics of that step ({} before any)."""

    type: ClassVar[str] = "snapshot"
    seq: int
    state: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Accepted(Message):
    type: ClassVar[str] = "accepted"
    request_id: str


@dataclass(frozen=True, slots=True)
class Output(Message):
    """New text/tokens of sample ``index`` since its previous ``output``."""

    type: ClassVar[str] = "output"
    request_id: str
    index: int
    text_delta: str
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class Finished(Message):
    """``outputs``: [{index, text, token_ids, finish_reason, stop_reason}];
    ``metrics``: times (unix s), ttft/e2e (s), token counts incl. num_cached_tokens."""

    type: ClassVar[str] = "finished"
    request_id: str
    outputs: list[dict[str, Any]]
    metrics: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Error(Message):
    type: ClassVar[str] = "error"
    code: str
    message: str
    request_id: str | None = None
    op: str | None = None  # the op that failed, so a client can match the reply

    @classmethod
    def from_exc(cls, exc: ProtocolError) -> Error:
        return cls(exc.code, exc.message, exc.request_id, exc.op)


@dataclass(frozen=True, slots=True)
class Ok(Message):
    """Acknowledges ``reset_prefix_cache`` and ``restart``; ``result`` says what happened."""

    type: ClassVar[str] = "ok"
    op: str
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Pong(Message):
    type: ClassVar[str] = "pong"
    ts: float  # server wall clock, so a client can see clock offset


def encode(msg: Message | Op) -> str:
    """Compact JSON text of a message or op."""
    return json.dumps(msg.to_dict(), separators=(",", ":"))


def step_frame(record_dict: dict[str, Any]) -> str:
    """The ``step`` message for ``StepRecord.to_dict()`` output (encoded once for all clients)."""
    return json.dumps({"type": "step", **record_dict}, separators=(",", ":"))
