"""Sink: where the engine thread's answers for one front-door client go.

This is the seam between the engine thread and every front door (the websocket
hub today; the OpenAI HTTP API next). A front door makes one Sink per client
(a websocket connection, an HTTP request), gets its ``id`` from
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

Identity is the object: only the sink that submitted a request may abort it,
and ``Detach(sink)`` aborts the sink's live requests (its client is gone). A
RequestOutput is read on the loop thread after the engine moved on, so the
engine must not mutate what a sink reads of it: the deltas, and the whole
output once finished.
"""

from __future__ import annotations

import abc
from typing import Union

from engine.outputs import RequestOutput
from engine.protocol.messages import Message

SinkItem = Union[Message, RequestOutput]


class Sink(abc.ABC):
    """One client of a front door. ``id`` (unique per server, from the mailbox) names
    requests submitted without an id and is recorded with each request."""

    id: int

    @abc.abstractmethod
    def deliver(self, item: SinkItem) -> None:
        """Take one answer; called on the event-loop thread, must not block."""
