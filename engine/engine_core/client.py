"""The engine's two ways to reach its core: in this process, or in a child of its own.

vLLM's core clients (``vllm/v1/engine/core_client.py``). Both have the same calls and
answer them the same way; the engine (``engine.llm_engine``) cannot tell them apart:

- ``InprocClient``: direct calls on an ``EngineCore`` of this process (``LLM``, the
  lessons, the benchmarks, tests that look into the scheduler: ``engine_core``).
- ``ProcessClient``: the core in a spawned child (``engine.engine_core.process``, started
  here; ``EngineConfig.engine_core_process``, ``kvscope serve``'s default). Each call is
  one msgpack command over a pipe and one answer (``engine.engine_core.messages``); the
  answer also says whether the core has work or events waiting, so the engine's loop
  asks the child nothing between steps. In one process every torch op gave the GIL
  away and the engine waited to take it back from the event loop and the recorder
  (38% of its time under the soak's hostile clients); in the child the forward holds
  no lock anyone else wants, and this process never imports torch.

A child that dies (killed, crashed) makes every later call raise ``CoreDied`` with its
exit code; the child reads EOF and ends when this process dies. SIGINT and SIGTERM are
ignored in the child: Ctrl-C and a service manager's stop reach the whole process
group, and the server stops the core in order (``close``).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from engine.engine_core import messages as m
from engine.engine_core.messages import CoreInfo, CoreStep, EngineCoreRequest
from engine.events.folds.pool_snapshot import PoolSnapshot

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.engine_core.core import EngineCore


class CoreDied(RuntimeError):
    """The core's process is gone; ``exitcode`` says how it ended (negative: a signal)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"the engine core process died (exit code {exitcode})")
        self.exitcode = exitcode


class LoadStopped(RuntimeError):
    """The core's start was given up (the server stopped while the model loaded)."""


class InprocClient:
    """The core in this process: every call is a direct call."""

    pid = None

    def __init__(self, core: EngineCore) -> None:
        self.engine_core = core

    @property
    def info(self) -> CoreInfo:
        return self.engine_core.info

    def add_request(self, request: EngineCoreRequest) -> list[str]:
        return self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)

    def step(self, stop_ids: list[str], summary: bool) -> CoreStep:
        return self.engine_core.step(stop_ids, summary)

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def has_pending_events(self) -> bool:
        return self.engine_core.has_pending_events()

    def reset_prefix_cache(self) -> int:
        return self.engine_core.reset_prefix_cache()

    def snapshot(self, tokens: bool = True) -> PoolSnapshot:
        return self.engine_core.snapshot(tokens)

    def stats(self) -> dict:
        return self.engine_core.stats()

    def restart(self, options: dict[str, Any], limits: dict[str, int] | None) -> CoreStep | None:
        return self.engine_core.restart(options, limits)

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        self.engine_core.close()


class ProcessClient:
    """The core in a spawned child, reached over a pipe (one command, one answer)."""

    def __init__(self, config: EngineConfig, progress: Callable[[str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        """Start the child and wait until its core is built. ``progress`` gets its load's
        log lines; ``should_stop`` is asked while waiting (True: kill it, raise
        ``LoadStopped``). A load that fails raises what the child raised."""
        from engine.engine_core.process import run_core_process

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of our threads
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=run_core_process, args=(config, child), daemon=True,
                                   name="kvscope-engine-core")
        self.process.start()
        child.close()
        self._unfinished = self._pending = False
        self.info = self._wait_ready(progress or (lambda line: None), should_stop or (lambda: False))

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def _wait_ready(self, progress: Callable[[str], None], should_stop: Callable[[], bool]) -> CoreInfo:
        while True:
            if should_stop():
                self.kill()
                raise LoadStopped("stopped while the engine core was loading")
            try:
                if not self._conn.poll(0.05):
                    if not self.process.is_alive():
                        raise CoreDied(self.process.exitcode)
                    continue
                msg = m.startup_decoder.decode(self._conn.recv_bytes())
            except (EOFError, OSError):
                self.process.join(5.0)
                raise CoreDied(self.process.exitcode) from None
            if isinstance(msg, m.Progress):
                progress(msg.line)
            elif isinstance(msg, m.LoadFailed):
                self.process.join(5.0)
                m.raise_failure(msg.failure)
            else:
                return msg.info

    def _call(self, command: msgspec.Struct) -> msgspec.Raw:
        try:
            self._conn.send_bytes(m.encode(command))
            answer = m.answer_decoder.decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            self.process.join(1.0)
            raise CoreDied(self.process.exitcode) from None
        self._unfinished, self._pending = answer.unfinished, answer.pending
        if answer.failure is not None:
            m.raise_failure(answer.failure)
        return answer.value

    def add_request(self, request: EngineCoreRequest) -> list[str]:
        return m.decode(self._call(m.AddRequestCall(request)), list[str])

    def abort_requests(self, request_ids: list[str]) -> None:
        self._call(m.AbortRequestsCall(request_ids))

    def step(self, stop_ids: list[str], summary: bool) -> CoreStep:
        return m.decode_step(self._call(m.StepCall(stop_ids, summary)))

    def has_unfinished_requests(self) -> bool:
        return self._unfinished

    def has_pending_events(self) -> bool:
        return self._pending

    def reset_prefix_cache(self) -> int:
        return m.decode(self._call(m.ResetPrefixCacheCall()), int)

    def snapshot(self, tokens: bool = True) -> PoolSnapshot:
        return PoolSnapshot.from_dict(m.decode(self._call(m.SnapshotCall(tokens)), dict))

    def stats(self) -> dict:
        return m.decode(self._call(m.StatsCall()), dict)

    def restart(self, options: dict[str, Any], limits: dict[str, int] | None) -> CoreStep | None:
        done = m.decode(self._call(m.RestartCall(options, limits)), m.Restarted)
        self.info = done.info
        return None if done.closing == m.NIL else m.decode_step(done.closing)

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child in order (it answers nothing more), or kill it after ``timeout``."""
        if self.process.is_alive():
            try:
                self._conn.send_bytes(m.encode(m.ShutdownCall()))
            except OSError:
                pass
            self.process.join(timeout)
        self.kill()
        self._conn.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)


def make_client(config: EngineConfig, progress: Callable[[str], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> InprocClient | ProcessClient:
    """The client ``config.engine_core_process`` asks for (the in-process one builds the
    core here, and so imports torch here)."""
    if config.engine_core_process:
        return ProcessClient(config, progress, should_stop)
    from engine.engine_core.startup import build_engine_core

    return InprocClient(build_engine_core(config))

