"""What crosses between the engine and its core: typed values, and their msgpack wire.

vLLM's seam (``vllm/v1/engine/__init__.py``): an ``EngineCoreRequest`` (token ids and
sampling params, never text) goes in; per step the core answers with each scheduled
request's new token (``EngineCoreOutput``, no text, no token history), the step's events
and the pool summary (``CoreStep``, ``engine.core.core_step``). Everything a step sends
is what the step did, so a message grows with the step's new tokens and blocks, never
with how long a request has run (tests/engine/test_engine_core.py holds that).

The in-process client hands these values over as they are; the process client sends
them as msgspec msgpack (``encode`` / ``decode_*`` below). Events are frozen
dataclasses of ``engine.events.schema.types``, one type per tag, so each crosses as
``(type, fields)`` and is decoded into its own class. Torch-free: the serving process
imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from engine.core.core_step import CoreStep, EngineCoreOutput, StepFault
from engine.core.errors import (
    ConfigError, EmptyPromptError, KVCacheTooSmallError, KVScopeError, PromptTooLongError,
    QueueFullError, SamplingParamsError,
)
from engine.core.sampling_params import SamplingParams
from engine.events.metrics.pool_summary import PoolSummary
from engine.events.schema.types import EVENT_TYPES


@dataclass(frozen=True, slots=True)
class EngineCoreRequest:
    """A request as the core takes it: tokenized, with its resolved seed."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seed: int
    client: str = ""


@dataclass(frozen=True, slots=True)
class CoreInfo:
    """What the core tells the engine once it is built (and again after a restart): the
    effective config (``describe``: JSON-able, derived values filled in) and the facts
    the serving side needs without the model (where the tokenizer is, the limits)."""

    describe: dict[str, Any]
    weights_dir: str
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_bytes_per_block: int


# ---- commands (engine -> core process) ----------------------------------------------


class AddRequestCall(msgspec.Struct, tag=True):
    request: EngineCoreRequest


class AbortRequestsCall(msgspec.Struct, tag=True):
    request_ids: list[str]


class StepCall(msgspec.Struct, tag=True):
    stop_ids: list[str]  # stop strings the output processor matched last step
    summary: bool  # is a pool summary wanted (someone reads the metrics)


class ResetPrefixCacheCall(msgspec.Struct, tag=True):
    pass


class SnapshotCall(msgspec.Struct, tag=True):
    tokens: bool = True


class StatsCall(msgspec.Struct, tag=True):
    pass


class RestartCall(msgspec.Struct, tag=True):
    options: dict[str, Any]
    limits: dict[str, int] | None


class ShutdownCall(msgspec.Struct, tag=True):
    pass


Command = (AddRequestCall | AbortRequestsCall | StepCall | ResetPrefixCacheCall | SnapshotCall | StatsCall
           | RestartCall | ShutdownCall)


# ---- answers (core process -> engine) -----------------------------------------------


class Failure(msgspec.Struct):
    """An exception the core raised for a command; raised again on the engine's side."""

    kind: str
    message: str


class Answer(msgspec.Struct):
    """Every command's answer: its value (raw, decoded by the caller, who knows its
    type) or the failure, and the core's state after it (what the engine's loop asks
    before every iteration: is there work, are events waiting)."""

    value: msgspec.Raw  # NIL for none
    failure: Failure | None
    unfinished: bool
    pending: bool


class Restarted(msgspec.Struct):
    """A restart's answer: the old run's last step (None: nothing to publish) and the
    new core's info."""

    closing: msgspec.Raw  # a CoreStep, or NIL
    info: CoreInfo


class Progress(msgspec.Struct, tag=True):
    """A log line of the model's loading (before ``Ready``): /healthz shows it."""

    line: str


class Ready(msgspec.Struct, tag=True):
    info: CoreInfo


class LoadFailed(msgspec.Struct, tag=True):
    failure: Failure


Startup = Progress | Ready | LoadFailed


class _WireStep(msgspec.Struct, array_like=True):
    step: int | None
    scheduled_at: float
    outputs: list[EngineCoreOutput]
    events: list[tuple[str, msgspec.Raw]]
    summary: PoolSummary | None
    fault: StepFault | None


_encoder = msgspec.msgpack.Encoder()
NIL = msgspec.Raw(_encoder.encode(None))  # msgpack's nil: a Raw field's "nothing" (Raw | None cannot decode)
_event_decoders = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in EVENT_TYPES.items()}
_step_decoder = msgspec.msgpack.Decoder(_WireStep)
command_decoder = msgspec.msgpack.Decoder(Command)
answer_decoder = msgspec.msgpack.Decoder(Answer)
startup_decoder = msgspec.msgpack.Decoder(Startup)


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def encode_step(s: CoreStep) -> msgspec.Raw:
    events = [(e.type, msgspec.Raw(_encoder.encode(e))) for e in s.events]
    return msgspec.Raw(_encoder.encode(_WireStep(s.step, s.scheduled_at, s.outputs, events,
                                                 s.summary, s.fault)))


def decode_step(raw: bytes) -> CoreStep:
    w = _step_decoder.decode(raw)
    events = [_event_decoders[tag].decode(body) for tag, body in w.events]
    return CoreStep(w.step, w.scheduled_at, w.outputs, events, w.summary, w.fault)


def decode(raw: bytes, type: Any) -> Any:
    return msgspec.msgpack.decode(raw, type=type)


# ---- failures ------------------------------------------------------------------------

_RAISABLE: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    KVScopeError, ConfigError, SamplingParamsError, PromptTooLongError, KVCacheTooSmallError,
    QueueFullError, EmptyPromptError, ValueError, TypeError, KeyError)}


class EngineCoreError(RuntimeError):
    """The core raised something the engine has no class for (the message says what)."""


def failure_of(exc: BaseException) -> Failure:
    kind = type(exc).__name__
    message = str(exc) if kind in _RAISABLE else f"{kind}: {exc}"
    return Failure(kind, message)


def raise_failure(f: Failure) -> None:
    raise _RAISABLE.get(f.kind, EngineCoreError)(f.message)
