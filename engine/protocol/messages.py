"""Server messages: what the server sends, one frame each.

One type per message, used on both ends: the server builds and encodes it, a
client decodes the frame back into the same type. Each is
``{"type": <name>, **fields}`` on the wire; a step carries a ``StepRecord``
(``engine.events.schema.step``), the one type for a published step everywhere.
Decoding ignores fields it does not know, so a newer server's additions do not
break an older client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.events.folds.run_kind import AnySnapshot, snapshot_from_dict
from engine.events.schema.step import StepRecord
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.fields import converted, from_wire, to_wire


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every server message; ``type`` is its name on the wire."""

    type: ClassVar[str] = "message"

    def to_dict(self) -> dict[str, Any]:
        return to_wire(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        """The message a decoded frame describes; ProtocolError if a field is missing or bad."""
        try:
            return cls(**cls._fields_of(d))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(ErrorCode.BAD_JSON, f"malformed {cls.type} message: {exc!r}") from None

    @classmethod
    def _fields_of(cls, d: dict[str, Any]) -> dict[str, Any]:
        return from_wire(cls, d)


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """First message of a connection, and again after every restart (a new run)."""

    type: ClassVar[str] = "hello"
    protocol: int
    run_id: str | None
    config: dict[str, Any]
    limits: dict[str, Any] = field(default_factory=dict)  # this server's bounds


@dataclass(frozen=True, slots=True)
class Snapshot(Message):
    """The state after step message ``seq`` (-1: before any step of this run), and the
    metrics of that step ({} before any). ``state`` is a ``PoolSnapshot`` for an engine,
    a ``HashCacheSnapshot`` (its JSON says ``"kind": "hash_cache"``) for ``kvscope attach``."""

    type: ClassVar[str] = "snapshot"
    seq: int
    state: AnySnapshot = converted(lambda state: state.to_dict(), snapshot_from_dict)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Step(Message):
    """One engine step: ``{"type": "step", seq, step, ts, events, metrics}``."""

    type: ClassVar[str] = "step"
    record: StepRecord

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **self.record.to_dict()}

    def to_json(self) -> str:
        """``to_dict()`` as compact JSON text, from the record's shared text."""
        return self.record.to_json('{"type":"step",')

    @classmethod
    def _fields_of(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {"record": StepRecord.from_dict(d)}  # the record's fields are the message's


@dataclass(frozen=True, slots=True)
class Steps(Message):
    """The answer to ``steps_since``: run ``run_id``'s steps after seq ``since``, in seq
    order. Steps neither buffered nor recorded are absent (a gap in ``seq``). ``more``:
    the reply stopped at its size bound; ask again from the last seq."""

    type: ClassVar[str] = "steps"
    run_id: str | None
    since: int
    steps: list[StepRecord] = converted(lambda records: [r.to_dict() for r in records],
                                        lambda dicts: [StepRecord.from_dict(d) for d in dicts])
    more: bool = False


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
    # the op this answers, so a client can match the reply; None for an error about a
    # request already accepted (its engine step failed: its ``finished`` follows)
    op: str | None = None

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


MESSAGES: dict[str, type[Message]] = {cls.type: cls for cls in (
    Hello, Snapshot, Step, Steps, Accepted, Output, Finished, Error, Ok, Pong)}


def message_from_dict(d: Any) -> Message:
    """The typed message of a decoded frame; raises ProtocolError for anything else."""
    if not isinstance(d, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "a server message must be a JSON object")
    cls = MESSAGES.get(d.get("type"))
    if cls is None:
        raise ProtocolError(ErrorCode.BAD_JSON, f"unknown message type {d.get('type')!r}")
    return cls.from_dict(d)
