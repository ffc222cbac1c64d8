"""InFlight: one websocket client's submits that still cost the server something.

A submit is in flight from the moment the front door takes it (before it is
tokenized or checked) until it is refused, or accepted and then finished. Counting
the ones not yet answered matters: a client sending big prompts that will all be
refused would otherwise keep any number of them being tokenized at once. The
front door refuses a submit (``too_many_in_flight``) when this count is at the
connection's limit; the engine thread's RequestBook keeps its own count of
accepted requests for every front door.

Every submit gets exactly one verdict, in the order it was sent (the front door
and the engine thread keep a connection's ops in order): ``accepted``, or an
``error`` whose ``op`` is ``submit``. An error about a request already accepted
(its step failed) carries no op and is not a verdict; its ``finished`` follows.

Writer: the connection's front door, on the event-loop thread.
"""

from __future__ import annotations

from engine.outputs import RequestOutput
from engine.protocol.messages import Accepted, Error
from engine.protocol.ops import Submit
from engine.server.worker.sink import SinkItem


class InFlight:
    def __init__(self) -> None:
        self.pending = 0  # taken, no verdict yet (being tokenized, queued or checked)
        self.live: set[str] = set()  # accepted, not finished

    def __len__(self) -> int:
        return self.pending + len(self.live)

    def taken(self) -> None:
        """The front door took a submit."""
        self.pending += 1

    def refused(self) -> None:
        """The front door itself refused a submit it took."""
        self.pending = max(0, self.pending - 1)

    def observe(self, item: SinkItem) -> None:
        """Account for one of the engine thread's answers on its way to the client."""
        if isinstance(item, Accepted):
            self.pending = max(0, self.pending - 1)
            self.live.add(item.request_id)
        elif isinstance(item, Error) and item.op == Submit.type:
            self.pending = max(0, self.pending - 1)
        elif isinstance(item, RequestOutput) and item.finished:
            self.live.discard(item.request_id)
