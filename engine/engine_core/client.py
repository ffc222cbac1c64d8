"""``ProcessClient``: the core in a child of its own (in this process the ``EngineCore``
is its own client). The calls, their wire, why a process and how a dead child and a stop
are handled: docs/architecture.md, "Two processes: the engine and its core". The child is
a fresh interpreter started by ``subprocess``: it never re-imports the parent's
``__main__`` and needs no resource tracker.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from engine.engine_core import messages as m
from engine.engine_core.messages import CoreInfo

if TYPE_CHECKING:
    from engine.config import EngineConfig

PROCESS_NAME = "engine.engine_core.process"  # in the child's command line: python -m PROCESS_NAME FD


class CoreDied(RuntimeError):
    """The core's process is gone; ``exitcode`` says how it ended (negative: a signal)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"the engine core process died (exit code {exitcode})")
        self.exitcode = exitcode


class LoadStopped(RuntimeError):
    """The core's start was given up (the server stopped while the model loaded)."""


class ProcessClient:
    """The core in a child process, reached over a socket (one call, one answer)."""

    def __init__(self, config: EngineConfig, progress: Callable[[str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        """Start the child and wait until its core is built. ``progress`` gets its load's
        log lines; ``should_stop`` is asked while waiting (True: kill it, raise
        ``LoadStopped``). A load that fails raises what the child raised."""
        ours, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen([sys.executable, "-m", PROCESS_NAME, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), env={**os.environ, "PYTHONPATH": path})
        theirs.close()
        self.pid = self.process.pid
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(m.encode(config))
        self._unfinished = self._pending = False
        self.info = self._wait_ready(progress or (lambda line: None), should_stop or (lambda: False))

    def _wait_ready(self, progress: Callable[[str], None], should_stop: Callable[[], bool]) -> CoreInfo:
        while True:
            if should_stop():
                self.kill()
                raise LoadStopped("stopped while the engine core was loading")
            try:
                if not self._conn.poll(0.05):
                    if not self.alive():
                        raise CoreDied(self.exitcode)
                    continue
                msg = m.startup_decoder.decode(self._conn.recv_bytes())
            except (EOFError, OSError):
                self._wait(5.0)
                raise CoreDied(self.exitcode) from None
            if isinstance(msg, str):
                progress(msg)
            elif msg.failure is not None:
                self._wait(5.0)
                m.raise_failure(msg.failure)
            else:
                return msg.info

    def _call(self, name: str, *args: Any) -> Any:
        """Call the core's method ``name`` (``messages.CALLS``) and wait for its answer."""
        try:
            self._conn.send_bytes(m.encode((name, args)))
            answer = m.answer_decoder.decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._wait(1.0)
            raise CoreDied(self.exitcode) from None
        self._unfinished, self._pending = answer.unfinished, answer.pending
        if answer.info is not None:
            self.info = answer.info
        if answer.failure is not None:
            m.raise_failure(answer.failure)
        return m.decode(answer.value, m.CALLS[name][1])

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The core's calls, as ``EngineCore`` names them (``messages.CALLS``: add_request,
        abort_requests, step, reset_prefix_cache, snapshot, stats, restart), each a ``_call``."""
        if name not in m.CALLS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return functools.partial(self._call, name)

    def has_unfinished_requests(self) -> bool:
        return self._unfinished

    def has_pending_events(self) -> bool:
        return self._pending

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> int | None:
        """How the child ended (negative: the signal that ended it), None while it runs."""
        return self.process.poll()

    def _wait(self, timeout: float) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child in order (our end closes: it reads EOF and ends), or kill it after
        ``timeout``."""
        self._conn.close()
        if self.alive():
            self._wait(timeout)
        self.kill()

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self._wait(5.0)
