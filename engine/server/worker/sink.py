"""Sink: where the engine thread's answers for one front-door client go.

The seam between the engine thread and every front door, and what a sink gets for a
``Submit``: docs/architecture.md, "Front doors". For the other ops ``sink.deliver(item)``
gets (on the event-loop thread, in the order the engine made them):

- ``Ok`` for ``ResetPrefixCache`` (``num_blocks_reset``), ``AbortAll`` (``num_aborted``)
  and ``Restart``; ``Error`` for a refused op;
- ``Hello`` and ``Snapshot`` for ``Attach`` and ``TakeSnapshot`` (subscribers).

Identity is the object: only the submitting sink may abort a request, and
``Detach(sink)`` aborts the sink's live requests. A RequestOutput is read on the loop
thread after the engine moved on, so the engine must not mutate what a sink reads of it:
the deltas, and the whole output once finished.
"""

from __future__ import annotations

import abc
import enum
from typing import ClassVar, Union

from engine.outputs import RequestOutput
from engine.protocol.messages import Message

SinkItem = Union[Message, RequestOutput]


class Source(str, enum.Enum):
    """The front door a request came through, as recorded with it."""

    WEBSOCKET = "websocket"  # protocol v2 ``submit``
    OPENAI = "openai"  # the OpenAI HTTP API (/v1/completions, /v1/chat/completions)


class Sink(abc.ABC):
    """One client of a front door. ``id`` (unique per server, from the mailbox) names
    requests submitted without an id and is recorded with each request; ``source``
    (set by each subclass) says which front door it is."""

    id: int
    source: ClassVar[Source]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # Checked here, not when the engine thread records a finished request, where a
        # missing source would be an AttributeError in the middle of a step.
        if not isinstance(getattr(cls, "source", None), Source):
            raise TypeError(f"{cls.__name__} must set source to a Source (which front door it is)")

    def client_key(self) -> str:
        """Who this sink's requests belong to, for the "fair" scheduling policy (which
        shares seats and each step's budget between clients): by default the sink itself
        (a websocket connection); the HTTP API's calls share their client address's."""
        return f"{self.source.value}:{self.id}"

    @abc.abstractmethod
    def deliver(self, item: SinkItem) -> None:
        """Take one answer; called on the event-loop thread, must not block."""
