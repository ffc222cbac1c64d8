"""The engine thread's mailbox: typed commands in, typed deliveries out.

The LLMEngine is not thread-safe, so exactly one thread (``engine_loop``) touches
it. The event-loop thread sends it ``Command``s through a ``CommandQueue``; the
engine thread answers with lists of ``Delivery``s handed to the loop with
``loop.call_soon_threadsafe`` (one call per batch, in order, so a client sees
its snapshot before the steps that follow it). Pure Python, no torch.
"""

from __future__ import annotations

import enum
import queue
import threading
from dataclasses import dataclass
from typing import Any

from engine.core.sampling_params import SamplingParams
from engine.events.step import StepRecord
from engine.outputs import RequestOutput
from engine.server.protocol import Hello, Message, Snapshot


class Source(str, enum.Enum):
    """Which front door a request came through (recorded with it)."""

    WEBSOCKET = "websocket"  # protocol v1 ``submit``: outputs go out as ``output``/``finished``
    OPENAI = "openai"  # the HTTP API: outputs go out as RequestOut for its SSE/JSON builders

# ---- commands (event-loop thread → engine thread) ---------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """Base class. ``conn_id`` names the connection that asked (0: the server itself)."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class Attach(Command):
    """A new connection: send it hello + a snapshot taken between steps, then steps."""


@dataclass(frozen=True, slots=True)
class Detach(Command):
    """The connection is gone: abort its in-flight requests."""


@dataclass(frozen=True, slots=True)
class Submit(Command):
    request_id: str | None  # None: the engine thread names it
    prompt: str | list[int] | None
    messages: list[dict[str, str]] | None
    params: SamplingParams
    source: Source = Source.WEBSOCKET


@dataclass(frozen=True, slots=True)
class Abort(Command):
    request_id: str


@dataclass(frozen=True, slots=True)
class TakeSnapshot(Command):
    pass


@dataclass(frozen=True, slots=True)
class ResetPrefixCache(Command):
    pass


@dataclass(frozen=True, slots=True)
class Restart(Command):
    options: dict[str, Any]  # keys from protocol.RESTART_KEYS only


@dataclass(frozen=True, slots=True)
class Shutdown(Command):
    """Abort everything, publish the last events, finish the run, end the thread."""


LIFECYCLE = (Attach, Detach, Shutdown)  # queued with put(), never refused


class CommandQueue:
    """FIFO of commands. Client ops (``try_put``) are bounded so a flood cannot grow
    memory without limit; lifecycle commands (``put``: attach, detach, shutdown)
    always get in, because dropping one would leak requests or hang shutdown."""

    def __init__(self, max_client_ops: int) -> None:
        if max_client_ops < 1:
            raise ValueError(f"max_client_ops must be >= 1, got {max_client_ops}")
        self.max_client_ops = max_client_ops
        self._q: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._client_ops = 0  # client ops queued and not yet taken

    def try_put(self, cmd: Command) -> bool:
        """Queue a client op; False when the bound is reached (the caller says ``busy``)."""
        with self._lock:
            if self._client_ops >= self.max_client_ops:
                return False
            self._client_ops += 1
        self._q.put(cmd)
        return True

    def put(self, cmd: Command) -> None:
        self._q.put(cmd)

    def take(self, block: bool, limit: int) -> list[Command]:
        """Up to ``limit`` commands; waits for the first one only when ``block``."""
        out: list[Command] = []
        try:
            out.append(self._q.get() if block else self._q.get_nowait())
            while len(out) < limit:
                out.append(self._q.get_nowait())
        except queue.Empty:
            pass
        n = sum(1 for c in out if not isinstance(c, LIFECYCLE))
        if n:
            with self._lock:
                self._client_ops -= n
        return out

    def __len__(self) -> int:
        return self._q.qsize()


# ---- deliveries (engine thread → event-loop thread) --------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    pass


@dataclass(frozen=True, slots=True)
class ToClient(Delivery):
    """A reply for one connection (never dropped for slowness)."""

    conn_id: int
    message: Message


@dataclass(frozen=True, slots=True)
class RequestOut(Delivery):
    """One RequestOutput of a request submitted with ``Source.OPENAI`` (never dropped).
    RequestOutputs are snapshots (fresh lists each step), safe to read on the loop thread."""

    conn_id: int
    output: RequestOutput


@dataclass(frozen=True, slots=True)
class StepOut(Delivery):
    """One published step, for every attached connection (droppable per client)."""

    record: StepRecord


@dataclass(frozen=True, slots=True)
class Attached(Delivery):
    """hello + snapshot for a new connection; from here on it receives steps."""

    conn_id: int
    hello: Hello
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class SnapshotTo(Delivery):
    """A snapshot a connection asked for; its queued (older) steps become moot."""

    conn_id: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class NewRun(Delivery):
    """After a restart: every attached connection gets this hello + snapshot."""

    hello: Hello
    snapshot: Snapshot
