"""EngineWorker: the one thread that owns the LLMEngine.

It loads the model, then loops: take commands (blocking only when the engine has
nothing to do, so an idle server sends no steps and burns no CPU), apply them,
step while there is work (unfinished requests or events not yet published), and
hand the results to the event loop as one batch of deliveries per iteration.

Snapshots are taken only when no events are pending (right after a step, or when
nothing happened since), so ``snapshot.seq`` is exact: the state equals the fold
of every step message up to ``seq`` and none after.

Writer of: the engine, the RequestBook, the run in the recorder and the health
board. Nothing else touches them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from engine.core import (
    ConfigError, KVScopeError, PromptTooLongError, QueueFullError, SamplingParamsError,
)
from engine.events.step import StepRecord
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.server import engine_commands as C
from engine.server.health import Health, HealthBoard, ProgressCapture, Status
from engine.server.protocol import (
    PROTOCOL_VERSION, Accepted, Error, ErrorCode as E, Finished, Hello, Message, Ok, Output, Snapshot,
)
from engine.server.request_book import RequestBook, finished_fields
from engine.startup import build_engine_parts
from engine.store.db import new_run_id

log = logging.getLogger("kvscope.server")

Post = Callable[[list[C.Delivery]], None]
EngineFactory = Callable[[EngineConfig], LLMEngine]
MAX_COMMANDS_PER_ITERATION = 256  # under a flood of ops, still step between batches


class EngineWorker(threading.Thread):
    def __init__(self, config: EngineConfig, post: Post, commands: C.CommandQueue,
                 board: HealthBoard, recorder: Any = None, label: str | None = None,
                 max_in_flight_per_conn: int = 64, limits: dict[str, Any] | None = None,
                 engine_factory: EngineFactory | None = None) -> None:
        super().__init__(name="kvscope-engine", daemon=True)
        self.config = config
        self.post = post
        self.commands = commands
        self.board = board
        self.recorder = recorder
        self.label = label
        self.limits = dict(limits or {})
        self.engine_factory = engine_factory or LLMEngine
        self.engine: LLMEngine | None = None
        self.run_id: str | None = None
        self.book = RequestBook(max_in_flight_per_conn)
        self._last_seq = -1
        self._out: list[C.Delivery] = []
        self._want_snapshot: list[C.Command] = []
        self.stop_requested = threading.Event()  # set by the app before it sends Shutdown

    # ---- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        try:
            with ProgressCapture(self.board):
                engine = self.engine_factory(self.config)
        except BaseException as exc:  # any load failure is reported, never raised into a void
            log.error("kvscope: loading %s failed: %s", self.config.model, exc)
            self.board.set(Health(Status.ERROR, f"{type(exc).__name__}: {exc}", model=self.config.model))
            self._drain_until_shutdown()
            return
        if self.stop_requested.is_set():  # stopped while loading: start no run at all
            return
        self._install(engine)
        try:
            self._serve()
        except BaseException:
            log.exception("kvscope: the engine thread crashed")
            self.board.set(Health(Status.ERROR, "the engine thread crashed; see the server log"))
            self._finish_run()
            raise

    def _drain_until_shutdown(self) -> None:
        while not any(isinstance(c, C.Shutdown) for c in self.commands.take(True, 1 << 30)):
            pass

    def _install(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._last_seq = -1
        self.book.new_run()
        config = engine.describe()
        if self.recorder is not None:
            self.run_id = self.recorder.start_run(config, model=engine.spec.name, label=self.label)
            run_id, rec = self.run_id, self.recorder
            engine.step_listeners.append(lambda r: rec.record_step(r, run_id))
        else:  # not recorded, but a new run still needs a new id (clients key on it)
            self.run_id = new_run_id()
        engine.step_listeners.append(self._on_step)
        self.board.set(Health(Status.READY, "ready", self.run_id, engine.spec.name, config))
        log.info("kvscope: engine ready (run %s, %d blocks x %d tokens)", self.run_id,
                 config["num_blocks"], config["block_size"])

    def _finish_run(self) -> None:
        if self.recorder is not None:
            self.recorder.finish(self.run_id)

    def _on_step(self, record: StepRecord) -> None:
        self._last_seq = record.seq
        self._out.append(C.StepOut(record))

    # ---- main loop ------------------------------------------------------------------

    def _busy(self) -> bool:
        e = self.engine
        return e.has_unfinished_requests() or e.has_pending_events()

    def _serve(self) -> None:
        while True:
            idle = not self._busy() and not self._want_snapshot
            for cmd in self.commands.take(idle, MAX_COMMANDS_PER_ITERATION):
                if isinstance(cmd, C.Shutdown):
                    self._shutdown()
                    return
                self._handle(cmd)
            if self._busy():
                self._step()
            self._answer_snapshots()
            self._flush()

    def _flush(self) -> None:
        if self._out:
            batch, self._out = self._out, []
            self.post(batch)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # an engine fault: fail the live requests, keep serving
            log.exception("kvscope: engine step failed; aborting live requests")
            for rid in self.book.live():
                self._reply(self.book.get(rid).conn_id,
                            Error(E.INTERNAL, f"engine step failed: {exc}", rid, "submit"))
            self._abort_all()
            return
        for out in outputs:
            self._deliver(out)

    # ---- commands ---------------------------------------------------------------------

    def _handle(self, cmd: C.Command) -> None:
        if isinstance(cmd, (C.Attach, C.TakeSnapshot)):
            self._want_snapshot.append(cmd)  # answered after the step, when no event is pending
        elif isinstance(cmd, C.Submit):
            self._submit(cmd)
        elif isinstance(cmd, C.Abort):
            owned = self.book.get(cmd.request_id)
            if owned is None or owned.conn_id != cmd.conn_id:
                self._reply(cmd.conn_id, Error(E.UNKNOWN_REQUEST, f"no live request {cmd.request_id!r} "
                                               f"of this connection", cmd.request_id, "abort"))
            else:
                self._abort(cmd.request_id)
        elif isinstance(cmd, C.Detach):
            # The submitter is gone: nobody will read these outputs, so stop spending on them.
            for rid in self.book.live(cmd.conn_id):
                self._abort(rid)
        elif isinstance(cmd, C.ResetPrefixCache):
            n = self.engine.reset_prefix_cache()
            self._reply(cmd.conn_id, Ok("reset_prefix_cache", {"num_blocks_reset": n}))
        elif isinstance(cmd, C.Restart):
            self._restart(cmd)
        else:
            raise TypeError(f"unknown command {cmd!r}")

    def _reply(self, conn_id: int, msg: Message) -> None:
        self._out.append(C.ToClient(conn_id, msg))

    def _submit(self, cmd: C.Submit) -> None:
        rid = cmd.request_id or self.book.name(cmd.conn_id)
        refusal = self.book.refuse(cmd.conn_id, rid)
        if refusal is not None:
            self._reply(cmd.conn_id, refusal)
            return
        try:
            self.engine.add_request(prompt=cmd.prompt, params=cmd.params, request_id=rid,
                                    messages=cmd.messages)
        except KVScopeError as exc:
            code = (E.PROMPT_TOO_LONG if isinstance(exc, PromptTooLongError) else
                    E.QUEUE_FULL if isinstance(exc, QueueFullError) else
                    E.BAD_PARAMS if isinstance(exc, SamplingParamsError) else E.BAD_REQUEST)
            self._reply(cmd.conn_id, Error(code, str(exc), rid, "submit"))
            return
        except Exception as exc:  # e.g. a chat template that rejects these messages
            self._reply(cmd.conn_id, Error(E.BAD_REQUEST, f"{type(exc).__name__}: {exc}", rid, "submit"))
            return
        self.book.add(rid, cmd.conn_id, cmd.params.to_dict())
        self._reply(cmd.conn_id, Accepted(rid))

    def _abort(self, rid: str) -> None:
        out = self.engine.abort_request(rid)
        if out is not None:
            self._deliver(out)
        else:  # already finished inside the engine; make sure we do not leak it
            self.book.release(rid)

    def _abort_all(self) -> None:
        for rid in self.book.live():
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
        for cmd in self._want_snapshot:
            if isinstance(cmd, C.Attach):
                self._out.append(C.Attached(cmd.conn_id, hello, snap))
            else:
                self._out.append(C.SnapshotTo(cmd.conn_id, snap))
        self._want_snapshot.clear()

    def _hello(self) -> Hello:
        return Hello(PROTOCOL_VERSION, self.run_id, self.engine.describe(), self.limits)

    # ---- outputs ------------------------------------------------------------------------

    def _deliver(self, out: RequestOutput) -> None:
        owned = self.book.get(out.request_id)
        if owned is None:
            return
        for index, (text, token_ids) in sorted(out.deltas.items()):
            if text or token_ids:
                self._reply(owned.conn_id, Output(out.request_id, index, text, list(token_ids)))
        if out.finished:
            outputs, metrics = finished_fields(out)
            self._reply(owned.conn_id, Finished(out.request_id, outputs, metrics))
            if self.recorder is not None:
                prompt = out.prompt if out.prompt is not None else str(out.prompt_token_ids)
                timings = dict(metrics, connection=owned.conn_id)
                self.recorder.record_request(out.request_id, prompt=prompt, params=owned.params,
                                             outputs=outputs, timings=timings, run_id=self.run_id)
            self.book.release(out.request_id)

    # ---- restart and shutdown -------------------------------------------------------------

    def _restart(self, cmd: C.Restart) -> None:
        old = self.engine
        try:
            cfg = dataclasses.replace(old.config, **cmd.options)
            check_restart(cfg, old)
            # Reuse the loaded weights: only the pool and the scheduler change. The new
            # pool is allocated before the old one is dropped, so a bad config leaves
            # the old engine serving (at the price of both pools for a moment).
            new = LLMEngine(cfg, build_engine_parts(cfg, loaded=old.parts.loaded),
                            kv_events=old.kv_events)  # one KV event stream across restarts
        except (KVScopeError, TypeError, ValueError) as exc:
            self._reply(cmd.conn_id, Error(E.BAD_CONFIG, str(exc), op="restart"))
            return
        self._abort_all()
        if old.has_pending_events():
            self._step()  # publish the aborts into the old run before it ends
        self._finish_run()
        old.hand_over_kv_events()
        old_run = self.run_id
        self._want_snapshot = [c for c in self._want_snapshot if isinstance(c, C.Attach)]
        self._install(new)
        self._out.append(C.NewRun(self._hello(), Snapshot(-1, new.snapshot(), {})))
        self._reply(cmd.conn_id, Ok("restart", {"run_id": self.run_id, "previous_run_id": old_run}))

    def _shutdown(self) -> None:
        self.board.set(Health(Status.STOPPING, "shutting down", self.run_id, self.engine.spec.name))
        self._abort_all()
        if self.engine.has_pending_events():
            self._step()
        self._finish_run()
        self._flush()
        self.engine.close()


def check_restart(cfg: EngineConfig, old: LLMEngine) -> None:
    """Refuse restarts a client should not be able to ask for: a pool bigger than the
    operator's (or the 1 GiB CPU default) would let any client exhaust the host's
    memory, and positions past the model's own limit give garbage."""
    limit = old.spec.max_position_embeddings
    if cfg.max_model_len is not None and cfg.max_model_len > limit:
        raise ConfigError(f"max_model_len {cfg.max_model_len} exceeds the model's {limit} positions")
    if cfg.num_kv_blocks is not None:
        budget = max(old.cache_config.num_blocks * old.parts.kv_bytes_per_block, DEFAULT_CPU_KV_BYTES)
        per_block = old.spec.kv_bytes_per_block(cfg.block_size, old.parts.loaded.dtype)
        if cfg.num_kv_blocks * per_block > budget:
            raise ConfigError(f"{cfg.num_kv_blocks} blocks of {cfg.block_size} tokens need "
                              f"{cfg.num_kv_blocks * per_block} bytes; this server allows at most "
                              f"{budget} ({budget // per_block} blocks)")
