"""The engine thread's mailbox: ops in (with the sink that sent them), deliveries out.

The LLMEngine is not thread-safe, so exactly one thread (``engine_loop``) touches
it. Front doors on the event-loop thread post ``Letter(sink, command)``s into a
``Mailbox``: the command is the protocol op itself (``engine.protocol.ops``), or
one of the lifecycle commands below. The engine thread answers with lists of
deliveries handed to the loop with ``loop.call_soon_threadsafe`` (one call per
batch, in order, so a client sees its snapshot before the steps that follow it).
Pure Python, no torch.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from engine.events.schema.step import StepRecord
from engine.protocol.messages import Hello, Snapshot
from engine.protocol.ops import Op, Submit
from engine.server.worker.sink import Sink, SinkItem

if TYPE_CHECKING:  # prompt_prep imports this module
    from engine.server.worker.prompt_prep import PromptPrep

# ---- commands (event-loop thread → engine thread) ---------------------------


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """Commands about a sink itself, from its front door; never refused by the bound,
    because dropping one would leak requests or hang shutdown."""


@dataclass(frozen=True, slots=True)
class Attach(Lifecycle):
    """Subscribe the sink: it gets hello + a snapshot taken between steps, then steps."""


@dataclass(frozen=True, slots=True)
class Detach(Lifecycle):
    """The sink's client is gone: abort its live requests (nobody reads them)."""


@dataclass(frozen=True, slots=True)
class Shutdown(Lifecycle):
    """Abort everything, publish the last events, finish the run, end the thread."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A ``Submit`` whose prompt the front door already checked and tokenized
    (``engine.server.worker.prompt_prep``), so the engine thread only enters it. Bounded
    like the op it carries. ``text``: the prompt text (the rendered chat for
    ``messages``), None for a prompt of token ids."""

    submit: Submit
    text: str | None
    token_ids: list[int]


Command = Union[Op, Prepared, Lifecycle]


@dataclass(frozen=True, slots=True)
class Letter:
    """One command and the sink its answers go to (None: the server itself)."""

    sink: Sink | None
    command: Command


class Mailbox:
    """FIFO of letters. Ops (``send``) are bounded so a flood cannot grow memory
    without limit; lifecycle commands (``send_lifecycle``) always get in."""

    def __init__(self, max_ops: int) -> None:
        if max_ops < 1:
            raise ValueError(f"max_ops must be >= 1, got {max_ops}")
        self.max_ops = max_ops
        self._q: queue.SimpleQueue[Letter] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ops = 0  # ops queued and not yet taken
        self._sink_ids = itertools.count(1)

    def new_sink_id(self) -> int:
        """An id no other sink of this server has (any front door, any thread)."""
        with self._lock:
            return next(self._sink_ids)

    def send(self, sink: Sink, op: Op | Prepared) -> bool:
        """Queue an op; False when the bound is reached (the caller says ``busy``)."""
        with self._lock:
            if self._ops >= self.max_ops:
                return False
            self._ops += 1
        self._q.put(Letter(sink, op))
        return True

    def send_lifecycle(self, sink: Sink | None, command: Lifecycle) -> None:
        self._q.put(Letter(sink, command))

    def take(self, block: bool, limit: int, timeout: float | None = None) -> list[Letter]:
        """Up to ``limit`` letters; waits for the first one only when ``block`` (at most
        ``timeout`` seconds, when given: then it may return none)."""
        out: list[Letter] = []
        try:
            out.append(self._q.get(timeout=timeout) if block else self._q.get_nowait())
            while len(out) < limit:
                out.append(self._q.get_nowait())
        except queue.Empty:
            pass
        n = sum(1 for letter in out if not isinstance(letter.command, Lifecycle))
        if n:
            with self._lock:
                self._ops -= n
        return out


# ---- deliveries (engine thread → event-loop thread) --------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer for one sink (never dropped for slowness)."""

    sink: Sink
    item: SinkItem


@dataclass(frozen=True, slots=True)
class StepOut:
    """One published step of run ``run_id``, for every subscriber (droppable per client)."""

    run_id: str
    record: StepRecord


@dataclass(frozen=True, slots=True)
class NewRun:
    """A new run (the first, or after a restart): every subscriber gets this hello +
    snapshot, and the front doors this engine's PromptPrep (its limits may change)."""

    hello: Hello
    snapshot: Snapshot
    prep: PromptPrep | None = None


Delivery = Union[Reply, StepOut, NewRun]
