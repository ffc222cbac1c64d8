"""PodSubscription: one pod's KV event stream, complete where it can be, marked where not.

A thread owns a ZMQ SUB socket (connected to the pod's PUB, or bound when the
endpoint is a wildcard: ``pod_source.subscriber_binds``, on loopback unless ``allow_remote``:
``pod_source.bind_endpoint``) and turns what arrives into stream items
(``engine.attach.stream_items``) on the worker's queue, in order:

- each batch is decoded with ``engine.kv_events.decoder`` (both event encodings);
- ``SeqTracker`` classifies its seq. Batches that are missing (a gap, the ones
  before the first batch seen, the start of a restarted segment) are asked of the
  pod's replay ROUTER with a fresh DEALER socket (a REQ socket would read only the
  first reply), which answers in either layout (``[seq, payload]`` or
  ``[topic, seq, payload]``); what replay cannot return becomes a ``Hole``;
- on start, and after ``QUIET_S`` without a batch, replay is asked from the next
  expected seq: it returns the history a late joiner missed, and batches lost at
  the tail, which no later batch would reveal;
- a batch that cannot be decoded is a one-batch ``Hole`` with the reason; a message
  that is not the protocol at all (no seq) is counted and logged.

Each batch handed over says how it came (``Received.fill``: ``live``, or replayed as
``history`` at the attach, to fill a ``gap`` or a restart's start, or at the ``tail`` after a
quiet spell) and its dialect (``engine.attach.wire``). The thread counts what the fidelity
monitor shows (``counters()``: gaps seen and filled, holes and batches lost, restarts,
duplicates, bad messages, replay failures, dialects) and keeps the last ``WIRE_KEEP`` raw
batches for the wire doctor (``last_frames()``).

``stop()`` ends the thread after it has handed over everything the socket already
received. Writer: this thread (sockets, tracker, counters, the raw batches).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from typing import Any

import zmq

from engine.attach.pod_source import PodSource, bind_endpoint, subscriber_binds
from engine.attach.seq_tracker import SeqTracker, Verdict
from engine.attach.stream_items import Hole, NewSegment, Received, StreamItem
from engine.attach.wire import dialect, dialect_key
from engine.kv_events.decoder import Frame, KVEventsDecodeError, decode_batch, parse_live
from engine.kv_events.replay import fetch_replay

log = logging.getLogger("kvscope.attach")

POLL_MS = 100  # how often the thread looks at its stop flag
QUIET_S = 2.0  # no batch for this long: ask replay for anything after the last one
REPLAY_TIMEOUT_S = 3.0
WIRE_KEEP = 16  # raw batches kept per pod for the wire doctor
RCVHWM = 1_000_000  # batches ZMQ may queue for us before it drops (we then replay the gap)


class PodSubscription(threading.Thread):
    def __init__(self, source: PodSource, out: queue.Queue[StreamItem],
                 context: zmq.Context | None = None, allow_remote: bool = False) -> None:
        super().__init__(name=f"kvscope-attach-{source.pod}", daemon=True)
        self.source = source
        self.out = out
        self.ctx = context or zmq.Context.instance()
        self.tracker = SeqTracker()
        self._stopping = threading.Event()
        self.caught_up = threading.Event()  # set once the first replay (the history) is handed over
        self.error: BaseException | None = None
        # counters (this thread writes them; others read single attributes)
        self.received = 0
        self.replayed = 0
        self.duplicates = 0
        self.bad_messages = 0
        self.replay_failures = 0
        self.gaps = self.gaps_filled = self.holes = self.lost_batches = self.restarts = 0
        self.fills: Counter[str] = Counter()  # batches applied, by how they came
        self.dialects: Counter[str] = Counter()  # batches by dialect_key
        self.dialect: dict[str, Any] = {}  # the latest batch's
        self.last_batch_wall: float | None = None  # time.time() of the latest batch received
        self._raw: deque[dict[str, Any]] = deque(maxlen=WIRE_KEEP)
        self._last_batch = time.monotonic()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, RCVHWM)
        self.sub.setsockopt(zmq.SUBSCRIBE, source.topic.encode("utf-8"))
        self.sub.linger = 0
        self.bound = bind_endpoint(source.endpoint, allow_remote) if subscriber_binds(source.endpoint) else None
        try:
            if self.bound is not None:
                if self.bound.startswith("tcp://[::"):
                    self.sub.setsockopt(zmq.IPV6, 1)
                self.sub.bind(self.bound)
                if self.bound != source.endpoint:
                    log.info("kvscope attach: pod %s: listening on %s only (loopback; --allow-remote "
                             "binds %s)", source.pod, self.bound, source.endpoint)
            else:
                self.sub.connect(source.endpoint)
        except zmq.ZMQError as exc:
            self.sub.close(0)
            raise OSError(f"pod {source.pod!r}: cannot open {self.bound or source.endpoint}: {exc}") from None

    def stop(self) -> None:
        self._stopping.set()

    def counters(self) -> dict[str, Any]:
        """What this subscription saw, for the fidelity monitor (any thread; a copy)."""
        return {"received": self.received, "replayed": self.replayed, "fills": dict(self.fills),
                "gaps": self.gaps, "gaps_filled": self.gaps_filled, "holes": self.holes,
                "lost_batches": self.lost_batches, "restarts": self.restarts,
                "duplicate_batches": self.duplicates, "bad_messages": self.bad_messages,
                "replay_failures": self.replay_failures, "dialects": dict(self.dialects),
                "dialect": dict(self.dialect), "last_batch_wall": self.last_batch_wall}

    def last_frames(self) -> list[dict[str, Any]]:
        """The last ``WIRE_KEEP`` batches as received: seq, topic, frames, fill, wall time, payload."""
        return list(self._raw)

    # ---- the thread ------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self.source.replay is not None:
                self._ask_replay(0, "history")  # what the pod published before we came
            self.caught_up.set()
            while not self._stopping.is_set():
                if self.sub.poll(POLL_MS):
                    self._drain()
                elif (self.source.replay is not None and self.tracker.next_seq is not None
                      and time.monotonic() - self._last_batch > QUIET_S):
                    self._ask_replay(self.tracker.next_seq, "tail")
                    self._last_batch = time.monotonic()
            self._drain()  # what the socket already holds is handed over, not dropped
        except BaseException as exc:  # reported by the worker; never a silent death
            self.error = exc
            log.exception("kvscope attach: the subscription of pod %s failed", self.source.pod)
        finally:
            self.caught_up.set()
            self.sub.close(0)

    def _drain(self) -> None:
        while True:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                frame = parse_live(frames)
            except KVEventsDecodeError as exc:
                self.bad_messages += 1
                if self.bad_messages in (1, 10, 100, 1000):
                    log.warning("kvscope attach: pod %s sent a message that is not a KV event "
                                "batch (%s); %d so far", self.source.pod, exc, self.bad_messages)
                continue
            self._last_batch = time.monotonic()
            self._on_frame(frame, replayed=False, fill="live")

    def _on_frame(self, frame: Frame, replayed: bool, fill: str) -> None:
        d = self.tracker.classify(frame.seq, frame.payload)
        if d.verdict is Verdict.DUPLICATE:
            self.duplicates += 1
            return
        if d.verdict is Verdict.GAP:
            self.gaps += 1
        if d.verdict is Verdict.RESTART:
            self.restarts += 1
        if d.verdict in (Verdict.FIRST, Verdict.RESTART):
            segment = self.tracker.start_segment()
            reason = "attach" if d.verdict is Verdict.FIRST else "restart"
            self._put(NewSegment(self.source.pod, segment, 0 if d.missing else frame.seq, reason))
            if reason == "restart":
                log.warning("kvscope attach: pod %s restarted (seq went back to %d): segment %d",
                            self.source.pod, frame.seq, segment)
        if d.missing:
            holes = self.holes
            self._fill(d.missing, before=frame, first=d.verdict is Verdict.FIRST)
            self.gaps_filled += d.verdict is Verdict.GAP and self.holes == holes
        self._apply(frame, replayed, fill)

    def _apply(self, frame: Frame, replayed: bool, fill: str) -> None:
        self.tracker.accept(frame.seq, frame.payload)
        seg = self.tracker.segment
        frames = 3 if frame.topic is not None else 2
        wire = dialect(frame.payload, frames)
        self.dialect = wire
        self.dialects[dialect_key(wire)] += 1
        self.last_batch_wall = time.time()
        self._raw.append({"seq": frame.seq, "segment": seg, "topic": frame.topic, "frames": frames,
                          "fill": fill, "wall": self.last_batch_wall, "payload": frame.payload})
        try:
            batch = decode_batch(frame.payload)
        except KVEventsDecodeError as exc:
            self.holes += 1
            self.lost_batches += 1
            self.fills["undecodable"] += 1
            self._put(Hole(self.source.pod, seg, frame.seq, frame.seq, f"undecodable: {exc}"))
            return
        self.received += 1
        self.replayed += replayed
        self.fills[fill] += 1
        self._put(Received(self.source.pod, seg, frame.seq, batch, replayed, fill, wire))

    # ---- replay -------------------------------------------------------------------------

    def _fill(self, missing: range, before: Frame, first: bool) -> None:
        """Ask replay for ``missing`` (the seqs right before ``before``); mark the rest."""
        got: dict[int, Frame] = {}
        reason = "no replay endpoint"
        if self.source.replay is not None:
            frames = self._fetch(missing.start)
            if frames is None:
                reason = "replay did not answer"
            else:
                got = {f.seq: f for f in frames if f.seq in missing}
                reason = ("published before the attach and no longer in the replay buffer" if first
                          else "not in the replay buffer")
        elif first:
            reason = "published before the attach (no replay endpoint)"
        run_start = None
        for seq in missing:
            f = got.get(seq)
            if f is None:
                run_start = seq if run_start is None else run_start
                continue
            if run_start is not None:
                self._hole(range(run_start, seq), reason)
                run_start = None
            self._apply(f, replayed=True, fill="history" if first else "gap")
        if run_start is not None:
            self._hole(range(run_start, missing.stop), reason)

    def _hole(self, seqs: range, reason: str) -> None:
        self.holes += 1
        self.lost_batches += len(seqs)
        self.tracker.skip(seqs)
        self._put(Hole(self.source.pod, self.tracker.segment, seqs.start, seqs.stop - 1, reason))

    def _ask_replay(self, start: int, fill: str) -> None:
        """Replay from ``start`` and take every batch it returns as if it arrived live."""
        frames = self._fetch(start)
        for f in frames or ():
            self._on_frame(f, replayed=True, fill=fill)

    def _fetch(self, start: int) -> list[Frame] | None:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        try:
            dealer.connect(self.source.replay)
            return fetch_replay(dealer, start, REPLAY_TIMEOUT_S)
        except (TimeoutError, KVEventsDecodeError, zmq.ZMQError) as exc:
            self.replay_failures += 1
            if self.replay_failures in (1, 10, 100):
                log.warning("kvscope attach: replay of pod %s from seq %d failed: %s",
                            self.source.pod, start, exc)
            return None
        finally:
            dealer.close(0)

    def _put(self, item: StreamItem) -> None:
        # Blocking: a slow worker holds us here and ZMQ queues (then drops, which we
        # replay). The worker drains this queue until every subscription has ended.
        self.out.put(item)
