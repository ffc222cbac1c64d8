"""Client ops: what a client asks of the server, one frame each.

One type per op, used on both ends and by the engine thread: a client builds and
encodes it, the server parses the frame into the same type, and the engine
thread executes that object as its command (the server adds only who sent it).
Validation happens on construction, so a client refuses what the server would
refuse, with the same code, before sending it.

Each op is ``{"type": <name>, **fields}`` on the wire (``op`` is accepted in
place of ``type``); fields that are None are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from engine.core.errors import SamplingParamsError
from engine.core.ids import MAX_REQUEST_ID_LEN, RequestIdError
from engine.core.ids import check_request_id as core_check_request_id
from engine.core.sampling_params import SamplingParams
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.fields import converted, from_wire, to_wire


# Engine options a client may change with ``restart``: pool and scheduler shape only.
# The model, device and anything touching files stay as the operator started them.
RESTART_KEYS = ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs",
                "max_model_len", "enable_prefix_caching", "enable_chunked_prefill", "n_sharing",
                "long_prefill_token_threshold")


def check_request_id(rid: Any, op: str) -> None:
    """Raise unless ``rid`` is a usable request id (the one rule: ``engine.core.ids``)."""
    try:
        core_check_request_id(rid)
    except RequestIdError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, str(exc), op=op) from None


@dataclass(frozen=True, slots=True)
class Op:
    """Base of every client op; ``type`` is its name on the wire."""

    type: ClassVar[str] = "op"

    def to_dict(self) -> dict[str, Any]:
        return to_wire(self, drop_none=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        """The op a frame's object describes: a field it leaves out takes its default, or
        None where it has none (which the op's own check refuses); other keys are ignored."""
        return cls(**from_wire(cls, d, missing=None))


@dataclass(frozen=True, slots=True)
class Submit(Op):
    """Generate for ``prompt`` (text or token ids) or ``messages`` (a chat). Without a
    ``request_id`` the server names it. Answer: ``accepted``, then ``output``s, then
    ``finished``, to the submitter only; or ``error`` with the request id."""

    type: ClassVar[str] = "submit"
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] | None = None
    # a dict of its fields (or None, the defaults) is converted on construction
    params: SamplingParams = converted(lambda p: p.to_dict(), default_factory=SamplingParams)
    request_id: str | None = None

    def __post_init__(self) -> None:
        if self.request_id is not None:
            check_request_id(self.request_id, "submit")
        _check_input(self.prompt, self.messages, self.request_id)
        object.__setattr__(self, "params", sampling_params(self.params, self.request_id))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Submit:
        op = cls(d.get("prompt"), d.get("messages"), d.get("params"), d.get("request_id"))
        unknown = set(d) - {"type", "op", *(f.name for f in fields(cls))}
        if unknown:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown submit field(s): {sorted(unknown)}",
                                op.request_id, "submit")
        return op


def sampling_params(params: SamplingParams | dict[str, Any] | None,
                    request_id: str | None = None) -> SamplingParams:
    """``params`` as SamplingParams (a dict of its fields, or None for the defaults);
    a bad field raises ProtocolError ``bad_params``."""
    if isinstance(params, SamplingParams):
        return params
    if params is not None and not isinstance(params, dict):
        raise ProtocolError(ErrorCode.BAD_PARAMS, "params must be an object of sampling parameters",
                            request_id, "submit")
    try:
        return SamplingParams.from_dict(dict(params or {}))
    except SamplingParamsError as exc:
        raise ProtocolError(ErrorCode.BAD_PARAMS, str(exc), request_id, "submit") from None


def _check_input(prompt: Any, messages: Any, rid: str | None) -> None:
    def bad(msg: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_REQUEST, msg, rid, "submit")

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
    if prompt is not None and len(prompt) == 0:
        raise ProtocolError(ErrorCode.EMPTY_PROMPT, "the prompt is empty; give some text or "
                            "token ids", rid, "submit")
    if messages is not None and not any(m["content"].strip() for m in messages):
        raise ProtocolError(ErrorCode.EMPTY_PROMPT, "every chat message is empty; write at least "
                            "one message", rid, "submit")


@dataclass(frozen=True, slots=True)
class Abort(Op):
    """Abort one of the sender's requests; it then ends with ``finished`` (reason ``abort``)."""

    type: ClassVar[str] = "abort"
    request_id: str

    def __post_init__(self) -> None:
        check_request_id(self.request_id, "abort")


@dataclass(frozen=True, slots=True)
class AbortAll(Op):
    """Abort every live request on the engine, whichever connection submitted it (the
    dashboard's "stop everything"); each ends with ``finished`` (reason ``abort``) to
    its submitter. Answer: ``ok`` with ``num_aborted``."""

    type: ClassVar[str] = "abort_all"


@dataclass(frozen=True, slots=True)
class TakeSnapshot(Op):
    """Answer: ``snapshot`` of the pool between two steps (queued older steps are dropped).
    Snapshot requests of one connection not yet answered share one answer, and a
    snapshot the client has not read yet is replaced by a newer one: a client is owed
    the latest state, once."""

    type: ClassVar[str] = "snapshot"


@dataclass(frozen=True, slots=True)
class StepsSince(Op):
    """Answer: ``steps`` with the step messages after ``seq`` of run ``run_id`` (default:
    the live run), from the server's step buffer or, when older, from its recording."""

    type: ClassVar[str] = "steps_since"
    seq: int
    run_id: str | None = None

    def __post_init__(self) -> None:
        if type(self.seq) is not int or self.seq < -1:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"steps_since needs 'seq': an integer >= -1, "
                                f"got {self.seq!r}", op="steps_since")
        if self.run_id is not None and not (isinstance(self.run_id, str)
                                            and 0 < len(self.run_id) <= MAX_REQUEST_ID_LEN):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"run_id must be a run id string, got "
                                f"{self.run_id!r}", op="steps_since")


@dataclass(frozen=True, slots=True)
class ResetPrefixCache(Op):
    """Forget every cached block hash. Answer: ``ok`` with ``num_blocks_reset``."""

    type: ClassVar[str] = "reset_prefix_cache"


@dataclass(frozen=True, slots=True)
class Ping(Op):
    """Answer: ``pong`` with the server's clock."""

    type: ClassVar[str] = "ping"


@dataclass(frozen=True, slots=True)
class Restart(Op):
    """Rebuild the engine with ``engine`` options (``RESTART_KEYS`` only): every client
    gets ``hello`` + ``snapshot`` of the new run, the asker then ``ok``. Live requests
    of the old engine end with ``finished`` (abort)."""

    type: ClassVar[str] = "restart"
    engine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.engine, dict):
            raise ProtocolError(ErrorCode.BAD_CONFIG, "restart needs 'engine': an object of engine options",
                                op="restart")
        unknown = set(self.engine) - set(RESTART_KEYS)
        if unknown:
            raise ProtocolError(ErrorCode.BAD_CONFIG, f"restart cannot change {sorted(unknown)}; "
                                f"allowed: {list(RESTART_KEYS)}", op="restart")


OPS: dict[str, type[Op]] = {cls.type: cls for cls in (
    Submit, Abort, AbortAll, TakeSnapshot, StepsSince, ResetPrefixCache, Ping, Restart)}


def op_from_dict(d: Any) -> Op:
    """The typed op of a decoded frame; raises ProtocolError with the reason."""
    if not isinstance(d, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "a frame must be a JSON object with a 'type' field")
    name = d.get("type", d.get("op"))
    cls = OPS.get(name) if isinstance(name, str) else None
    if cls is None:
        rid = d.get("request_id") if isinstance(d.get("request_id"), str) else None
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {name!r}; expected one of {sorted(OPS)}",
                            rid)
    return cls.from_dict(d)
