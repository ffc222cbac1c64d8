"""EngineWorker: the one thread that owns the LLMEngine (docs/architecture.md, "Front
doors: one port, one mailbox"). Where the engine's core runs (this process, or a child:
``EngineConfig.engine_core_process``) is the engine's business, not this thread's.

It starts the engine, then loops: take letters from the mailbox (blocking only when the
engine has nothing to do, so an idle server sends no steps and burns no CPU), execute
their commands (the protocol op itself, or a lifecycle command; answers are ``Reply``s to
the letter's sink, whichever front door made it), step while there is work (unfinished
requests or events not yet published), and hand the results to the event loop as one
batch of deliveries per iteration.

Snapshots are taken only when no events are pending, so ``snapshot.seq`` is exact: the
state equals the fold of every step message up to ``seq`` and none after. A core process
that dies ends this thread (docs/architecture.md, "Two processes").

Writer of: the engine, the RequestBook, the run in the recorder and the health board.
Past 300 lines on purpose: it is one thread's loop, and its commands, restart and shutdown
all write that one state; split, its only writer would be read from several files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.core import KVScopeError
from engine.engine_core.client import CoreDied, LoadStopped
from engine.engine_core.memory_hygiene import Trimmer, freeze_heap
from engine.engine_core.progress import ProgressCapture
from engine.events.schema.step import StepRecord
from engine.events.schema.types import PROTOCOL_VERSION
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.protocol.errors import ErrorCode, ProtocolError, code_of
from engine.protocol.messages import Accepted, Error, Hello, Ok, Snapshot
from engine.protocol.ops import Abort, AbortAll, ResetPrefixCache, Restart, Submit, TakeSnapshot
from engine.server.worker.health import Health, HealthBoard, Status
from engine.server.worker.mailbox import (
    Attach, Delivery, Detach, Letter, Mailbox, NewRun, Prepared, Reply, Shutdown, StepOut,
)
from engine.server.worker.output_messages import finished_fields
from engine.server.worker.prompt_prep import PromptPrep
from engine.server.worker.request_book import RequestBook
from engine.server.worker.sink import Sink, SinkItem
from engine.store.db import new_run_id

log = logging.getLogger("kvscope.server")

Post = Callable[[list[Delivery]], None]
EngineFactory = Callable[[EngineConfig], LLMEngine]
MAX_LETTERS_PER_ITERATION = 256  # under a flood of ops, still step between batches
IDLE_CHECK_S = 0.5  # how often an idle worker looks whether its core's process is alive


class EngineWorker(threading.Thread):
    def __init__(self, config: EngineConfig, post: Post, mailbox: Mailbox,
                 board: HealthBoard, recorder: Any = None, label: str | None = None,
                 max_in_flight_per_sink: int = 64, limits: dict[str, Any] | None = None,
                 engine_factory: EngineFactory | None = None, client_restart: bool = True) -> None:
        super().__init__(name="kvscope-engine", daemon=True)
        self.config = config
        self.post = post
        self.mailbox = mailbox
        self.board = board
        self.recorder = recorder
        self.label = label
        self.limits = dict(limits or {})
        self.engine_factory = engine_factory
        self.engine: LLMEngine | None = None
        self.run_id: str | None = None
        self.book = RequestBook(max_in_flight_per_sink)
        self._last_seq = -1
        self._out: list[Delivery] = []
        self._want_snapshot: list[Letter] = []  # Attach and TakeSnapshot letters
        self.prep: PromptPrep | None = None  # the current engine's, also handed to the front doors
        # Restart is a privilege: the operator may turn it off, and a client's restart is
        # bounded by what the first engine was started with (not by the running one).
        # (When the server has a token, only clients presenting it get a connection.)
        self.client_restart = client_restart
        self.stop_requested = threading.Event()  # set by the app before it sends Shutdown
        self.trimmer = Trimmer()  # hands freed heap back to the OS now and then (memory_hygiene)
        self.frozen_objects = 0  # what the last freeze_heap froze (memory_hygiene)

    # ---- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        try:
            with ProgressCapture(self.board.note):
                engine = (self.engine_factory(self.config) if self.engine_factory is not None else
                          LLMEngine.from_config(self.config, progress=self.board.note,
                                                should_stop=self.stop_requested.is_set))
        except LoadStopped:
            return
        except BaseException as exc:  # any load failure is reported, never raised into a void
            log.error("kvscope: loading %s failed: %s", self.config.model, exc)
            self.board.set(Health(Status.ERROR, f"{type(exc).__name__}: {exc}", model=self.config.model))
            self._drain_until_shutdown()
            return
        if self.stop_requested.is_set():  # stopped while loading: start no run at all
            return
        self._install(engine)
        del engine  # self.engine is the one reference: a restart must be able to free it
        # The run's NewRun goes out now, not with the first letter's answers: the loop
        # would otherwise wait for a client's op (the first of an idle server blocks
        # this thread), and until it arrives the front doors have no PromptPrep (an
        # API call's prompts would be tokenized here) and /metrics no run.
        self.flush()
        try:
            self._serve()
        except CoreDied as exc:
            log.error("kvscope: %s", exc)
            self.board.set(Health(Status.ERROR, str(exc), self.run_id, self.engine.model_name))
            self._finish_run()
        except BaseException:
            log.exception("kvscope: the engine thread crashed")
            self.board.set(Health(Status.ERROR, "the engine thread crashed; see the server log"))
            self._finish_run()
            raise

    def alive(self) -> bool:
        """The worker runs and its core can answer (a core's process may have died)."""
        return self.is_alive() and (self.engine is None or self.engine.core.alive())

    def _drain_until_shutdown(self) -> None:
        while not any(isinstance(letter.command, Shutdown) for letter in self.mailbox.take(True, 1 << 30)):
            pass

    def _install(self, engine: LLMEngine) -> None:
        """Start a run on ``engine``; every subscriber is told (hello + empty snapshot)."""
        self.engine = engine
        self._last_seq = -1
        self.book.new_run()
        config = engine.describe()
        if self.recorder is not None:
            self.run_id = self.recorder.start_run(config, model=engine.model_name, label=self.label)
            run_id, rec = self.run_id, self.recorder
            engine.step_listeners.append(lambda r: rec.record_step(r, run_id))
        else:  # not recorded, but a new run still needs a new id (clients key on it)
            self.run_id = new_run_id()
        engine.step_listeners.append(self._on_step)
        self.prep = PromptPrep.of(engine, self.prep)
        # Before "ready": full collections skip the loaded heap from the first request
        # on (a restart's old engine, no longer referenced, is collected first).
        self.frozen_objects = freeze_heap()
        self._out.append(NewRun(self._hello(), Snapshot(-1, engine.snapshot(), {}), self.prep))
        self.board.set(Health(Status.READY, "ready", self.run_id, engine.model_name, config))
        log.info("kvscope: engine ready (run %s, %d blocks x %d tokens)", self.run_id,
                 config["num_blocks"], config["block_size"])

    def _finish_run(self) -> None:
        if self.recorder is not None:
            self.recorder.finish(self.run_id)

    def _on_step(self, record: StepRecord) -> None:
        self._last_seq = record.seq
        self._out.append(StepOut(self.run_id, record))

    # ---- main loop ------------------------------------------------------------------

    def _busy(self) -> bool:
        e = self.engine
        return e.has_unfinished_requests() or e.has_pending_events()

    def _serve(self) -> None:
        while True:
            idle = not self._busy() and not self._want_snapshot
            letters = self.mailbox.take(idle, MAX_LETTERS_PER_ITERATION, IDLE_CHECK_S)
            if idle and not letters and not self.engine.core.alive():
                raise CoreDied(self.engine.core.exitcode)
            for letter in letters:
                if isinstance(letter.command, Shutdown):
                    self._shutdown()
                    return
                self._execute(letter)
            if self._busy():
                self._step()
            self._answer_snapshots()
            self.flush()
            self.trimmer.tick()

    def flush(self) -> None:
        """Post what this iteration queued, as one batch."""
        if self._out:
            batch, self._out = self._out, []
            self.post(batch)

    def _step(self) -> None:
        """One engine step. Where part of it failed (``last_fault``: the core failed the
        requests whose own forward raised, or every request a step that raised held,
        ``engine.engine_core.core``), each failed request's submitter gets ``error``
        (internal) and then its ``finished`` (abort), and the engine keeps serving."""
        outputs = self.engine.step()
        fault = self.engine.last_fault
        if fault is not None:
            for f in fault.failures:
                owned = self.book.get(f.request_id)
                if owned is not None:  # no op: its submit was accepted; its finished follows
                    self._reply(owned.sink, Error(ErrorCode.INTERNAL, f"the engine step running this "
                                                  f"request failed ({f.detail}); the request was "
                                                  f"aborted", f.request_id))
            self.board.note_step_failure(fault.detail, len(fault.failures))
        for out in outputs:  # the failed requests' finished (abort) come first
            self._deliver(out)

    # ---- commands ---------------------------------------------------------------------

    def _execute(self, letter: Letter) -> None:
        sink, cmd = letter.sink, letter.command
        if isinstance(cmd, (Attach, TakeSnapshot)):
            self._want_snapshot.append(letter)  # answered after the step, when no event is pending
        elif isinstance(cmd, (Submit, Prepared)):
            self._submit(sink, cmd)
        elif isinstance(cmd, Abort):
            owned = self.book.get(cmd.request_id)
            if owned is None or owned.sink is not sink:
                self._reply(sink, Error(ErrorCode.UNKNOWN_REQUEST, f"no live request {cmd.request_id!r} "
                                        f"of this connection", cmd.request_id, cmd.type))
            else:
                self._abort(cmd.request_id)
        elif isinstance(cmd, AbortAll):
            n = len(self.book.live())
            self._abort_all()
            self._reply(sink, Ok(cmd.type, {"num_aborted": n}))
        elif isinstance(cmd, Detach):  # nobody will read its outputs: stop spending on them
            self._abort_all(sink)
        elif isinstance(cmd, ResetPrefixCache):
            n = self.engine.reset_prefix_cache()
            self._reply(sink, Ok(cmd.type, {"num_blocks_reset": n}))
        elif isinstance(cmd, Restart):
            self._restart(sink, cmd)
        else:  # e.g. ping or steps_since: the front door answers those itself
            log.error("kvscope: the engine thread cannot execute %r", cmd)
            self._reply(sink, Error(ErrorCode.UNKNOWN_OP, f"{type(cmd).__name__} is answered by "
                                    f"the front door, not the engine", op=getattr(cmd, "type", None)))

    def _reply(self, sink: Sink | None, item: SinkItem) -> None:
        if sink is not None:
            self._out.append(Reply(sink, item))

    def _submit(self, sink: Sink, cmd: Submit | Prepared) -> None:
        """Enter a submit. A ``Prepared`` one was checked and tokenized by its front door
        (off this thread); a plain ``Submit`` (a front door that does not prepare) gets
        the same checks here, from the same PromptPrep."""
        op = cmd.submit if isinstance(cmd, Prepared) else cmd
        rid = op.request_id or self.book.name(sink)
        refusal = self.book.refuse(sink, rid, op.params)
        if refusal is not None:
            self._reply(sink, refusal)
            return
        if not isinstance(cmd, Prepared):
            try:
                cmd = self.prep.prepare(op)
            except ProtocolError as exc:
                self._reply(sink, Error(exc.code, exc.message, rid, op.type))
                return
        try:
            self.engine.add_request(params=op.params, request_id=rid, tokenized=(cmd.text, cmd.token_ids),
                                    client=sink.client_key())
        except Exception as exc:  # a refusal (KVScopeError); anything else is never fatal either
            text = str(exc) if isinstance(exc, KVScopeError) else f"{type(exc).__name__}: {exc}"
            self._reply(sink, Error(code_of(exc), text, rid, op.type))  # bad_request if not a refusal
            return
        self.book.add(rid, sink, op.params.to_dict())
        self._reply(sink, Accepted(rid))

    def _abort(self, rid: str) -> None:
        out = self.engine.abort_request(rid)
        if out is not None:
            self._deliver(out)
        else:  # already finished inside the engine; make sure we do not leak it
            self.book.release(rid)

    def _abort_all(self, sink: Sink | None = None) -> None:
        """Abort every live request (of ``sink``, or all)."""
        for rid in self.book.live(sink):
            try:
                self._abort(rid)
            except Exception:
                log.exception("kvscope: aborting %s failed", rid)
                self.book.release(rid)

    def _answer_snapshots(self) -> None:
        if not self._want_snapshot or self.engine.has_pending_events():
            return
        hello = self._hello()
        snap = Snapshot(self._last_seq, self.engine.snapshot(), dict(self.engine.last_metrics))
        answered: set[int] = set()  # a sink's requests of one round get one snapshot
        for letter in self._want_snapshot:
            if isinstance(letter.command, Attach):
                self._reply(letter.sink, hello)
            if letter.sink is not None and letter.sink.id not in answered:
                answered.add(letter.sink.id)
                self._reply(letter.sink, snap)
        self._want_snapshot.clear()

    def _hello(self) -> Hello:
        return Hello(PROTOCOL_VERSION, self.run_id, self.engine.describe(), self.limits)

    # ---- outputs ------------------------------------------------------------------------

    def _deliver(self, out: RequestOutput) -> None:
        owned = self.book.get(out.request_id)
        if owned is None:
            return
        self._reply(owned.sink, out)
        if out.finished:
            if self.recorder is not None:
                outputs, metrics = finished_fields(out)
                prompt = out.prompt if out.prompt is not None else str(out.prompt_token_ids)
                timings = dict(metrics, connection=owned.sink.id)
                self.recorder.record_request(out.request_id, prompt=prompt, params=owned.params,
                                             outputs=outputs, timings=timings, run_id=self.run_id,
                                             source=owned.sink.source.value)
            self.book.release(out.request_id)

    # ---- restart and shutdown -------------------------------------------------------------

    def _restart(self, sink: Sink, cmd: Restart) -> None:
        if not self.client_restart:
            self._reply(sink, Error(ErrorCode.RESTART_DISABLED, "this server's operator disabled "
                                    "client restarts (kvscope serve --no-client-restart)", op=cmd.type))
            return
        old = self.engine
        try:  # every request is aborted, its finished delivered, the old run's last step published
            new = old.restart(cmd.engine, self._deliver)
        except (KVScopeError, TypeError, ValueError) as exc:
            self._reply(sink, Error(ErrorCode.BAD_CONFIG, str(exc), op=cmd.type))
            return
        self._finish_run()
        old_run = self.run_id
        self._want_snapshot = [w for w in self._want_snapshot if isinstance(w.command, Attach)]
        del old  # self.engine is the last reference: _install drops it before it freezes
        self._install(new)
        self._reply(sink, Ok(cmd.type, {"run_id": self.run_id, "previous_run_id": old_run}))

    def _shutdown(self) -> None:
        self.board.set(Health(Status.STOPPING, "shutting down", self.run_id, self.engine.model_name))
        self._abort_all()
        if self.engine.has_pending_events():
            self._step()
        self._finish_run()
        self.flush()
        self.engine.close()
