"""SeqTracker: reads one pod's batch sequence numbers as next, gap, duplicate or restart.

A publisher numbers its batches 0, 1, 2, ... and starts again at 0 when it restarts.
Given each received seq (and its payload), ``classify`` says:

- ``NEXT``: the one expected;
- ``FIRST``: the first batch this tracker sees; ``missing`` is what came before it
  in its segment (``0..seq-1``: published before the attach);
- ``GAP``: later than expected; ``missing`` is the skipped range;
- ``DUPLICATE``: a batch already applied (a replay answer overlaps the live stream:
  same seq, same payload);
- ``RESTART``: lower than expected and not one already applied: the publisher
  restarted, a new segment begins; ``missing`` is ``0..seq-1`` of it.

``accept`` marks a seq applied (from the live stream or a replay), so the tracker's
expectation moves on. Pure logic, no sockets.

Writer: the pod's subscription thread.
"""

from __future__ import annotations

import enum
import zlib
from collections import OrderedDict
from dataclasses import dataclass

RECENT = 1 << 16  # applied seqs remembered to recognise duplicates (a replay's reach)


class Verdict(enum.Enum):
    FIRST = "first"
    NEXT = "next"
    GAP = "gap"
    DUPLICATE = "duplicate"
    RESTART = "restart"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    missing: range  # seqs of the current segment before this one that never arrived


def digest(payload: bytes) -> int:
    return zlib.crc32(payload)


class SeqTracker:
    def __init__(self) -> None:
        self.segment = -1  # -1: nothing seen yet
        self.next_seq: int | None = None
        self._applied: OrderedDict[int, int] = OrderedDict()  # seq -> payload digest

    def classify(self, seq: int, payload: bytes) -> Decision:
        if self.next_seq is None:
            return Decision(Verdict.FIRST, range(0, seq))
        if seq == self.next_seq:
            return Decision(Verdict.NEXT, range(0))
        if seq > self.next_seq:
            return Decision(Verdict.GAP, range(self.next_seq, seq))
        if self._applied.get(seq) == digest(payload):
            return Decision(Verdict.DUPLICATE, range(0))
        return Decision(Verdict.RESTART, range(0, seq))

    def start_segment(self) -> int:
        """A new segment (the first, or after a restart); returns its number."""
        self.segment += 1
        self.next_seq = 0
        self._applied.clear()
        return self.segment

    def accept(self, seq: int, payload: bytes) -> None:
        """``seq`` (with this payload) is applied; everything before it is settled."""
        self._applied[seq] = digest(payload)
        if len(self._applied) > RECENT:
            self._applied.popitem(last=False)
        if self.next_seq is None or seq >= self.next_seq:
            self.next_seq = seq + 1

    def skip(self, seqs: range) -> None:
        """``seqs`` will never arrive (a hole): expect what follows them."""
        if seqs and (self.next_seq is None or seqs.stop > self.next_seq):
            self.next_seq = seqs.stop
