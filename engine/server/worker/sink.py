"""Sink: where the engine thread's answers for one front-door client go.

This is the seam between the engine thread and every front door (the websocket
hub; the OpenAI HTTP API, ``engine.openai``). A front door makes one Sink per client
(a websocket connection, an HTTP call), gets its ``id`` from
``Mailbox.new_sink_id()`` and sends protocol ops with it:
``mailbox.send(sink, Submit(...))``. The engine thread answers with
``Reply(sink, item)`` deliveries, and the event loop calls ``sink.deliver(item)``
for each, in the order the engine made them. ``item`` is:

- ``Accepted`` once a ``Submit`` entered the engine, or ``Error`` (with the
  request id) if it did not;
- a ``RequestOutput`` for every step in which the request made progress: its
  ``deltas`` are new text and tokens per sample since the previous one, and the
  last has ``finished`` set (also after an ``Abort``, with reason ``abort``);
- ``Ok`` for ``ResetPrefixCache`` (``num_blocks_reset``), ``AbortAll`` (``num_aborted``) and ``Restart``;
  ``Error`` for a refused op;
- ``Hello`` and ``Snapshot`` for ``Attach`` and ``TakeSnapshot`` (subscribers).

A sink's class names its front door (``source``): the engine thread records it
with every request the sink submits (the ``requests.source`` column).

Identity is the object: only the sink that submitted a request may abort it,
and ``Detach(sink)`` aborts the sink's live requests (its client is gone). A
RequestOutput is read on the loop thread after the engine moved on, so the
engine must not mutate what a sink reads of it: the deltas, and the whole
output once finished.
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
