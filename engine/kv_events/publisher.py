"""KVEventsPublisher: an engine's KV cache events on ZMQ, in vLLM's wire format, off its thread.

The engine calls ``on_step`` (a step listener) on its own thread; that only puts
``(ts, events)`` on a bounded queue, so a step costs one ``put_nowait``. The
publisher thread maps the events to vLLM's (``engine.kv_events.mapping``), encodes
one batch per step that has any, and sends ``[topic, seq, payload]`` on a PUB
socket with ``seq`` counting batches from 0. A PUB socket never blocks: a slow or
absent subscriber costs at most ``hwm`` queued messages, then ZMQ drops for it.
The same thread keeps the last ``buffer_steps`` batches and answers replay requests
on a ROUTER (``engine.kv_events.replay``).

A step whose only KV events are a prefix-cache reset (kvscope's engine takes a step of its
own to hand a reset's events over) is held back and sent with the next step's batch,
whatever that step caches: vLLM queues a reset's ``AllBlocksCleared`` until its next
engine step, so a reset and the request after it are one batch in both streams
(tests/vllm/test_kv_events.py). ``announce_cleared`` (a restart) is sent at once.

When the queue is full (the thread cannot keep up) the step is dropped and counted;
if it had KV events its seq number is skipped, so subscribers see the hole (and
replay cannot fill it) instead of a silently wrong cache. vLLM blocks its engine
instead; kvscope never lets observation stall serving.

Writer: the engine thread writes the queue (``on_step``) and nothing else; the
publisher thread owns the sockets, ``seq``, the replay buffer and the counters.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import zmq

from engine.core.errors import ConfigError
from engine.events.schema.types import Event, PrefixCacheReset
from engine.kv_events.config import KVEventsConfig, should_bind
from engine.kv_events.encoding import BatchEncoder, seq_bytes
from engine.kv_events.mapping import has_kv_events, is_reset_only, to_kv_events
from engine.kv_events.replay import ReplayBuffer
from engine.kv_events.types import MEDIUM_GPU, KVEventBatch

logger = logging.getLogger(__name__)

_STOP = object()
IDLE_POLL_S = 0.05  # how long the thread waits on the queue before it looks at replay requests
CLOSE_LINGER_MS = 1000  # on close, ZMQ keeps sending what is queued for up to this long


class KVEventsPublisher:
    def __init__(self, config: KVEventsConfig, medium: str | None = MEDIUM_GPU,
                 data_parallel_rank: int = 0) -> None:
        """Bind or connect the sockets now (errors surface here), then start the thread.

        ``medium``: vLLM's ``"GPU"`` is its engine's own KV pool on any device (vLLM 0.32's
        CPU build sends it too), so it is kvscope's pool's name on CPU and CUDA alike."""
        if not config.active:
            raise ConfigError("kv_events_config does not enable a ZMQ publisher "
                              "(set enable_kv_cache_events: true)")
        self.config = config
        self.medium = medium
        self.data_parallel_rank = data_parallel_rank
        self._topic = config.topic.encode("utf-8")
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._lost_before_next = 0  # engine thread only: steps with KV events dropped since the last put
        self._closed = False
        self.seq = 0  # the next batch's sequence number (publisher thread)
        self._held: list = []  # a reset's events, waiting for the next step (publisher thread)
        self.num_batches = 0
        self.num_dropped_steps = 0  # engine thread: steps dropped because the queue was full
        self.num_replays = 0
        self._replay = ReplayBuffer(config.buffer_steps)
        self._encoder = BatchEncoder(config.encoding)
        # Context.instance(), as vLLM: an inproc:// endpoint is reachable from this process.
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._router = None
        try:
            self._pub.setsockopt(zmq.SNDHWM, config.hwm)
            _open(self._pub, config.endpoint, should_bind(config.endpoint))
            if config.replay_endpoint is not None:
                self._router = self._ctx.socket(zmq.ROUTER)
                # One whole replay fits in the ROUTER's queue: past its HWM a ROUTER drops silently.
                self._router.setsockopt(zmq.SNDHWM, config.buffer_steps + 1)
                _open(self._router, config.replay_endpoint, bind=True)
        except BaseException:
            self._close_sockets(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()
        # A forgotten close() still flushes at exit; the weakref keeps atexit from pinning us.
        ref = weakref.ref(self)
        self._atexit = lambda: (p := ref()) is not None and p.close()
        atexit.register(self._atexit)
        logger.info("kv events: publishing on %s (%s)%s, %s encoding", config.endpoint,
                    "bound" if should_bind(config.endpoint) else "connected",
                    f", replay on {config.replay_endpoint}" if config.replay_endpoint else "",
                    config.encoding)

    # ---- engine thread ---------------------------------------------------------------

    def on_step(self, record: Any) -> None:
        """Step listener: queue the step's events (never blocks)."""
        self._put(record.ts, record.events)

    def announce_cleared(self, ts: float | None = None) -> None:
        """Publish ``AllBlocksCleared`` now: the cache this stream described is gone (a restart)."""
        self._put(time.time() if ts is None else ts, (PrefixCacheReset(0),), hold_reset=False)

    def _put(self, ts: float, events: Sequence[Event], hold_reset: bool = True) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait((ts, events, self._lost_before_next, hold_reset))
        except queue.Full:
            self.num_dropped_steps += 1
            if has_kv_events(events):
                self._lost_before_next += 1
            return
        self._lost_before_next = 0

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every step queued so far is sent; False on timeout (tests, shutdown)."""
        if self._closed:
            return not self._thread.is_alive()
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to ``timeout``), stop the thread, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            logger.warning("kv events: queue still full at close; %d steps not sent", self._queue.qsize())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("kv events: publisher thread did not stop in %.1fs", timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        return {"batches": self.num_batches, "next_seq": self.seq, "dropped_steps": self.num_dropped_steps,
                "replays": self.num_replays, "queued": self._queue.qsize(), "buffered": len(self._replay)}

    # ---- publisher thread ----------------------------------------------------------

    def _run(self) -> None:
        # Without a replay socket there is nothing to look at between steps: block on the queue.
        wait = IDLE_POLL_S if self._router is not None else None
        try:
            while True:
                if self._router is not None:
                    while self._router.poll(0):
                        self._serve_replay()
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    continue
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                try:
                    self._publish(*item)
                except Exception:  # one bad step must not end the stream
                    logger.exception("kv events: publishing a step failed")
        finally:
            self._close_sockets(linger=CLOSE_LINGER_MS)

    def _publish(self, ts: float, events: Sequence[Event], lost_before: int, hold_reset: bool) -> None:
        self.seq += lost_before
        kv = self._held + to_kv_events(events, self.medium)
        self._held = []
        if not kv:
            return
        if hold_reset and is_reset_only(events):  # vLLM sends it with its next engine step
            self._held = kv
            return
        payload = self._encoder.encode(KVEventBatch(ts, tuple(kv), self.data_parallel_rank))
        seq = self.seq
        self.seq += 1
        try:
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # a connecting PUB with no peer yet; the batch stays replayable
            pass
        self._replay.append(seq, payload)
        self.num_batches += 1

    def _serve_replay(self) -> None:
        try:
            self._replay.answer(self._router, self._topic)
            self.num_replays += 1
        except zmq.ZMQError:
            logger.exception("kv events: answering a replay request failed")

    def _close_sockets(self, linger: int) -> None:
        for sock in (self._pub, self._router):
            if sock is not None and not sock.closed:
                sock.close(linger=linger)


def _open(sock: zmq.Socket, endpoint: str, bind: bool) -> None:
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"kv events: cannot {'bind' if bind else 'connect'} {endpoint}: {exc}") from None
