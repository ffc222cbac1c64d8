"""EngineProcess: the engine worker in a process of its own (``kvscope serve``'s default).

Why: in one process the engine thread shares the GIL with the event loop (websocket
and HTTP framing, JSON, every client's frames) and the recorder. Every torch op
releases the GIL and takes it back, and taking it back waits for whichever thread
holds it. Under a soak's hostile clients the engine thread spent 38% of its time
waiting for the GIL (bench/RESULTS.md, "Soak"), so every request's steps slowed
with the other clients' traffic. vLLM runs its ``EngineCore`` in a process of its
own for the same reason. Here the child runs the same ``EngineWorker`` as the
thread (``engine_loop``), and the front door's process keeps what it had: the hub,
the API, the recorder, ``/healthz`` and ``/metrics``.

The seam is the mailbox (``engine.server.mailbox``), both ways over two pipes:

- **In** (parent → child): a forwarder thread takes letters from the front door's
  ``Mailbox`` (still the bound on queued ops: while the child does not read, the pipe
  fills, the forwarder waits and the mailbox refuses ops with ``busy``) and sends them
  with their sink as ``(id, source, client key)``. The child's ``PipeMailbox`` makes
  one ``RemoteSink`` per sink id (kept while anything of the child refers to it, so
  "only the submitter may abort" still compares objects).
- **Out** (child → parent): each batch the worker posts, in order, with what the
  child's ``RecorderProxy`` and ``RemoteBoard`` did in between (the recorder's calls
  ride in the batch, so a run's last steps are recorded before it is finished and a
  new run starts after). A reader thread applies them: the recorder (in this
  process), the ``HealthBoard``, and the deliveries to the loop (``post``), each
  ``Reply`` given back its sink (the parent holds sinks weakly: a sink nobody holds
  any more is a client gone, and its answers have nowhere to go).
- **Outputs.** A running request's output crosses as what is new only
  (``engine.server.output_wire``: the child's ``OutputWire``, the parent's ``OutputMirror``).

If the child dies, ``/healthz`` says ``error`` with its exit code, and the API answers
503 (``alive()``). SIGINT and SIGTERM are ignored in the child: Ctrl-C in a terminal and
a service manager's stop reach the whole process group, and the front door's graceful
stop is what ends the child (a ``Shutdown`` letter); if the front door itself dies, the
child reads EOF and shuts down the same way.

Threads: the forwarder and the reader (parent); the worker runs in the child's main thread.
"""

from __future__ import annotations

import collections
import copy
import logging
import multiprocessing
import os
import signal
import threading
import weakref
from typing import Any

from engine.config import EngineConfig
from engine.outputs import RequestOutput
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error
from engine.server.health import Health, HealthBoard, Status
from engine.server.mailbox import Letter, Mailbox, NewRun, Prepared, Reply, Shutdown
from engine.server.output_wire import OutputDelta, OutputMirror, OutputWire
from engine.server.sink import Source

log = logging.getLogger("kvscope.server")

LETTERS_PER_SEND = 256  # letters the forwarder sends in one message
STALE_CHECK_EVERY = 64  # batches between the child's sweeps for outputs never finished


# ---- the child's stand-ins -------------------------------------------------------------------


class RemoteSink:
    """A front door's sink as the child sees it: its id, front door and client key."""

    __slots__ = ("id", "source", "_key", "__weakref__")

    def __init__(self, sink_id: int, source: Source, key: str) -> None:
        self.id, self.source, self._key = sink_id, source, key

    def client_key(self) -> str:
        return self._key


class PipeMailbox:
    """The child's mailbox: letters as the forwarder sent them, in order. EOF (the front
    door's process is gone) reads as a ``Shutdown``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._buf: collections.deque[Letter] = collections.deque()
        self._sinks: weakref.WeakValueDictionary[int, RemoteSink] = weakref.WeakValueDictionary()
        self._eof = False

    def take(self, block: bool, limit: int) -> list[Letter]:
        out: list[Letter] = []
        while len(out) < limit:
            if not self._buf and not self._fill(block and not out):
                break
            out.append(self._buf.popleft())
            if isinstance(out[-1].command, Shutdown):  # nothing after it counts (and EOF repeats it)
                break
        return out

    def __len__(self) -> int:
        return len(self._buf)

    def _fill(self, block: bool) -> bool:
        if self._eof:
            self._buf.append(Letter(None, Shutdown()))
            return True
        try:
            if not block and not self._conn.poll(0):
                return False
            wire = self._conn.recv()
        except (EOFError, OSError):
            self._eof = True
            self._buf.append(Letter(None, Shutdown()))
            return True
        for sink_id, source, key, command in wire:
            sink = None
            if sink_id is not None:
                sink = self._sinks.get(sink_id)
                if sink is None:
                    sink = self._sinks[sink_id] = RemoteSink(sink_id, source, key)
            self._buf.append(Letter(sink, command))
        return True


class Channel:
    """The child's one way out (the worker thread's batches and the board's notes)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.broken = False

    def send(self, msg: tuple) -> None:
        with self._lock:
            if self.broken:
                return
            try:
                self._conn.send(msg)
            except OSError:  # the front door is gone; the mailbox will read EOF
                self.broken = True
            except Exception:  # something in it would not pickle: send the rest, never stop
                log.exception("kvscope: an engine message would not cross to the server")
                if msg[0] == "batch" and len(msg[1]) > 1:
                    for item in msg[1]:
                        self._send_alone(("batch", [item]))

    def _send_alone(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except OSError:
            self.broken = True
        except Exception:
            log.error("kvscope: dropped an engine message that would not pickle: %.200r", msg)


class RemoteBoard(HealthBoard):
    """The child's HealthBoard: every change also goes to the front door's board."""

    def __init__(self, model: str, channel: Channel) -> None:
        super().__init__(model)
        self._channel = channel

    def set(self, health: Health) -> None:
        super().set(health)
        self._channel.send(("health", health))

    def note_step_failure(self, detail: str, num_requests: int) -> None:
        super().note_step_failure(detail, num_requests)
        self._channel.send(("fault", detail, num_requests))

    def note(self, line: str) -> None:
        super().note(line)
        self._channel.send(("note", line))


class RecorderProxy:
    """The child's recorder: each call becomes an item of the worker's next batch
    (``emit``: ``EngineWorker.emit``), applied to the real recorder by the parent."""

    def __init__(self) -> None:
        self.emit: Any = None  # set once the worker exists

    def start_run(self, config: dict[str, Any], model: str | None = None,
                  label: str | None = None) -> str:
        from engine.store.db import new_run_id

        run_id = new_run_id()
        self.emit(("rec", "start_run", (config,), {"model": model, "label": label, "run_id": run_id}))
        return run_id

    def record_step(self, record: Any, run_id: str | None = None) -> None:
        self.emit(("rec", "record_step", (record, run_id), {}))

    def record_request(self, request_id: str, **kw: Any) -> None:
        self.emit(("rec", "record_request", (request_id,), kw))

    def finish(self, run_id: str | None = None) -> None:
        self.emit(("rec", "finish", (run_id,), {}))


def child_main(config: EngineConfig, inbox: Any, outbox: Any, opts: dict[str, Any]) -> None:
    """The engine process: one EngineWorker, run in this (main) thread."""
    from engine.server.engine_loop import EngineWorker

    # The front door stops us (a Shutdown letter, or EOF if it died): Ctrl-C and a service
    # manager's SIGTERM reach the whole process group, and would kill us mid-step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=opts["log_level"], format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    channel = Channel(outbox)
    wire = OutputWire()
    batches = [0]
    recorder = RecorderProxy() if opts["record"] else None

    def post(batch: list) -> None:
        out: list = []
        for d in batch:
            if isinstance(d, Reply):
                item = d.item
                out.append(("R", d.sink.id, wire.slim(item) if isinstance(item, RequestOutput) else item))
            elif isinstance(d, NewRun) and d.prep is not None:
                prep = copy.copy(d.prep)
                prep.source = None  # the engine's own tokenizer stays here
                out.append(NewRun(d.hello, d.snapshot, prep))
            else:
                out.append(d)
        batches[0] += 1
        if batches[0] % STALE_CHECK_EVERY == 0 and wire.sent:
            gone = wire.forget_all_but(lambda rid: worker.book.get(rid) is not None)
            if gone:
                out.append(("forget", gone))
        channel.send(("batch", out))

    worker = EngineWorker(config, post, PipeMailbox(inbox), RemoteBoard(config.model, channel), recorder,
                          opts["label"], opts["max_in_flight"], opts["limits"],
                          client_restart=opts["client_restart"])
    if recorder is not None:
        recorder.emit = worker.emit
    try:
        worker.run()
    finally:
        worker.flush()


# ---- the front door's side -------------------------------------------------------------------


class EngineProcess:
    """What ``KVScopeServer`` starts instead of an ``EngineWorker`` thread: the same
    ``start`` / ``is_alive`` / ``join`` / ``stop_requested``, over a child process."""

    def __init__(self, config: EngineConfig, post: Any, mailbox: Mailbox, board: HealthBoard,
                 recorder: Any = None, label: str | None = None, max_in_flight_per_sink: int = 64,
                 limits: dict[str, Any] | None = None, client_restart: bool = True) -> None:
        self.config, self.post, self.mailbox, self.board, self.recorder = config, post, mailbox, board, recorder
        self.opts = {"label": label, "max_in_flight": max_in_flight_per_sink, "limits": dict(limits or {}),
                     "client_restart": client_restart, "record": recorder is not None,
                     "log_level": logging.getLogger().getEffectiveLevel()}
        self.stop_requested = threading.Event()
        self.mirror = OutputMirror()
        self.process: multiprocessing.process.BaseProcess | None = None
        self._sinks: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._sinks_lock = threading.Lock()
        self._run_id: str | None = None  # the child's run, until it finishes it (finished here if it dies)
        self._to_child: Any = None
        self._reader: threading.Thread | None = None
        self._forwarder: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of our threads
        child_in, self._to_child = ctx.Pipe(duplex=False)
        from_child, child_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=child_main, name="kvscope-engine", daemon=True,
                                   args=(self.config, child_in, child_out, self.opts))
        self.process.start()
        child_in.close()
        child_out.close()
        self._reader = threading.Thread(target=self._read, args=(from_child,), daemon=True,
                                        name="kvscope-engine-reader")
        self._forwarder = threading.Thread(target=self._forward, daemon=True, name="kvscope-engine-forwarder")
        self._reader.start()
        self._forwarder.start()
        log.info("kvscope: engine process %d started", self.process.pid)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the child to end (it ends after a ``Shutdown``), then for its last
        messages to be applied; a child still running after ``timeout`` is killed."""
        p = self.process
        if p is None:
            return
        p.join(timeout)
        if p.is_alive():
            log.warning("kvscope: the engine process did not stop in %ss; terminating it", timeout)
            self.kill()
        if self._reader is not None:
            self._reader.join(timeout)

    def kill(self) -> None:
        p = self.process
        if p is not None and p.is_alive():
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)

    # ---- the forwarder: mailbox -> child ----------------------------------------------------

    def _forward(self) -> None:
        conn, broken = self._to_child, False
        while True:
            letters = self.mailbox.take(True, LETTERS_PER_SEND)
            wire = []
            with self._sinks_lock:
                for letter in letters:
                    sink = letter.sink
                    if sink is None:
                        wire.append((None, None, None, letter.command))
                    else:
                        self._sinks[sink.id] = sink
                        wire.append((sink.id, sink.source, sink.client_key(), letter.command))
            if not broken:
                try:
                    conn.send(wire)
                except OSError:
                    broken = True  # the child is gone: drain the mailbox so nothing piles up
                except Exception:  # a command that would not pickle: it alone is refused
                    broken = self._send_one_by_one(conn, letters, wire)
            if any(isinstance(letter.command, Shutdown) for letter in letters):
                conn.close()
                return

    def _send_one_by_one(self, conn: Any, letters: list[Letter], wire: list) -> bool:
        """Send each letter alone; one that cannot be sent gets an ``internal`` error.
        True if the child is gone."""
        refused = []
        for letter, w in zip(letters, wire):
            try:
                conn.send([w])
            except OSError:
                return True
            except Exception as exc:
                log.exception("kvscope: a command would not cross to the engine process")
                op = letter.command.submit if isinstance(letter.command, Prepared) else letter.command
                if letter.sink is not None:
                    refused.append(Reply(letter.sink, Error(
                        ErrorCode.INTERNAL, f"the command could not be sent to the engine "
                        f"({type(exc).__name__})", getattr(op, "request_id", None),
                        getattr(op, "type", None))))
        if refused:
            self.post(refused)
        return False

    # ---- the reader: child -> recorder, board, loop -----------------------------------------

    def _read(self, conn: Any) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._apply(msg)
            except Exception:  # one bad message must not stop the rest
                log.exception("kvscope: applying the engine process's %r failed", msg[0])
        conn.close()
        self.mirror.clear()
        p = self.process
        if p is not None:
            p.join(5)
        code = None if p is None else p.exitcode
        if not self.stop_requested.is_set():
            log.error("kvscope: the engine process exited unexpectedly (exit code %s)", code)
            self.board.set(Health(Status.ERROR, f"the engine process exited unexpectedly (exit code {code}); "
                                                f"see the server log", model=self.config.model))
        if self.recorder is not None and self._run_id is not None:  # it ended without finishing its run
            self.recorder.finish(self._run_id)

    def _apply(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "batch":
            self._deliver(msg[1])
        elif kind == "health":
            self.board.set(msg[1])
        elif kind == "fault":
            self.board.note_step_failure(msg[1], msg[2])
        elif kind == "note":
            self.board.note(msg[1])
        else:
            raise ValueError(f"unknown message {kind!r} from the engine process")

    def _deliver(self, items: list) -> None:
        out = []
        for item in items:
            if isinstance(item, tuple):
                tag = item[0]
                if tag == "R":
                    _, sink_id, answer = item
                    if isinstance(answer, (RequestOutput, OutputDelta)):
                        answer = self.mirror.full(answer)  # kept up to date even for a sink gone
                    with self._sinks_lock:
                        sink = self._sinks.get(sink_id)
                    if sink is not None:
                        out.append(Reply(sink, answer))
                elif tag == "rec":
                    _, name, args, kw = item
                    if name == "start_run":
                        self._run_id = kw["run_id"]
                    elif name == "finish":
                        self._run_id = None
                    if self.recorder is not None:
                        getattr(self.recorder, name)(*args, **kw)
                elif tag == "forget":
                    self.mirror.forget(item[1])
                else:
                    raise ValueError(f"unknown item {tag!r} from the engine process")
            else:
                if isinstance(item, NewRun):
                    self.mirror.clear()
                out.append(item)
        if out:
            self.post(out)


def pid_of(worker: Any) -> int:
    """The engine's process id: the child's, or this process's for a thread."""
    return getattr(worker, "pid", None) or os.getpid()
