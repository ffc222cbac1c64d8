"""What crosses between the engine and its core: typed values, and their msgpack wire.

vLLM's seam (``vllm/v1/engine/__init__.py``): an ``EngineCoreRequest`` (token ids and
sampling params, never text) goes in; per step the core answers with each scheduled
request's new token (``EngineCoreOutput``, no text, no token history), the step's events
and the pool summary (``CoreStep``, ``engine.core.core_step``). Everything a step sends
is what the step did, so a message grows with the step's new tokens and blocks, never
with how long a request has run (tests/engine/test_engine_core.py holds that).

The in-process client hands these values over as they are; the process client sends
them as msgspec msgpack (``encode`` / ``decode`` below). Events are frozen
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
from engine.events.folds.pool_snapshot import PoolSnapshot
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
    effective config (``describe``: JSON-able, derived values filled in: ``block_size``,
    ``num_blocks``, ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``kv_bytes_per_block``) and what the serving side needs without the model."""

    describe: dict[str, Any]
    weights_dir: str  # where the tokenizer is
    vocab_size: int


# ---- calls (engine -> core process) and their answers ----------------------------------

# The calls a core in its own process answers: ``EngineCore``'s methods of these names,
# with their arguments' types and their answer's. A call crosses as ``(name, args)``.
CALLS: dict[str, tuple[Any, Any]] = {
    "add_request": (tuple[EngineCoreRequest], list[str]),
    "abort_requests": (tuple[list[str]], None),
    "step": (tuple[list[str], bool], CoreStep),  # stop ids matched last step; is a pool summary wanted
    "reset_prefix_cache": (tuple[()], int),
    "snapshot": (tuple[()], PoolSnapshot),
    "stats": (tuple[()], dict),
    "restart": (tuple[dict[str, Any]], CoreStep | None),
}


class Failure(msgspec.Struct):
    """An exception the core raised for a call; raised again on the engine's side."""

    kind: str
    message: str


class Answer(msgspec.Struct):
    """Every call's answer: its value (raw, decoded by the caller, who knows its type)
    or the failure, and the core's state after it (what the engine's loop asks before
    every iteration: is there work, are events waiting; the core's info when the call
    changed it, as a restart does). The core's load is answered the same way: its info,
    or the failure; before that, each log line of the load crosses as a str."""

    value: msgspec.Raw  # NIL for none
    failure: Failure | None
    unfinished: bool
    pending: bool
    info: CoreInfo | None = None


_encoder = msgspec.msgpack.Encoder()
NIL = msgspec.Raw(_encoder.encode(None))  # msgpack's nil: a Raw field's "nothing" (Raw | None cannot decode)
_event_decoders = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in EVENT_TYPES.items()}
_step_decoder = msgspec.msgpack.Decoder(tuple[int | None, float, list[EngineCoreOutput], list[tuple[str, msgspec.Raw]],
                                              PoolSummary | None, StepFault | None])
_args_decoders = {name: msgspec.msgpack.Decoder(args) for name, (args, _) in CALLS.items()}
call_decoder = msgspec.msgpack.Decoder(tuple[str, msgspec.Raw])
answer_decoder = msgspec.msgpack.Decoder(Answer)
startup_decoder = msgspec.msgpack.Decoder(str | Answer)  # a load's log line, then its answer


def encode(value: Any) -> bytes:
    """msgpack of ``value``; a ``CoreStep``'s events cross as ``(type, fields)``."""
    if isinstance(value, CoreStep):
        value = (value.step, value.scheduled_at, value.outputs, [(e.type, e) for e in value.events],
                 value.summary, value.fault)
    return _encoder.encode(value)


def decode(raw: bytes, type: Any) -> Any:
    """``encode``'s inverse, for a value of ``type`` (NIL: None)."""
    if raw == NIL:
        return None
    if type not in (CoreStep, CoreStep | None):
        return msgspec.msgpack.decode(raw, type=type)
    step, scheduled_at, outputs, events, summary, fault = _step_decoder.decode(raw)
    return CoreStep(step, scheduled_at, outputs, [_event_decoders[tag].decode(body) for tag, body in events],
                    summary, fault)


def decode_args(name: str, args: bytes) -> tuple:
    """A call's arguments, typed by ``CALLS``; TypeError for a call the core does not answer."""
    if name not in _args_decoders:
        raise TypeError(f"the engine core has no call {name!r}")
    return _args_decoders[name].decode(args)


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
