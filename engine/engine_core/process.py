"""The engine core's own process: build the core, then answer calls until the engine closes.

Started by ``engine.engine_core.client.ProcessClient`` as ``python -m
engine.engine_core.process FD`` (a fresh interpreter, so torch is imported here and never
in the serving process; FD is its end of a socket pair, whose first message is the
``EngineConfig``). While the model loads, each log line of the ``engine`` loggers goes to
the client (``/healthz`` shows it); then an ``Answer`` with the core's info, or the
failure. After
that the loop is one call in (an ``EngineCore`` method of ``messages.CALLS``), one
``Answer`` out, in order: the client waits for
each answer, so the core never runs ahead of the engine and both processes see the
same sequence of states as the in-process client would.

Writer of: nothing but its own copy of the core; the pipe's far end is the engine.
"""

from __future__ import annotations

import logging
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from engine.cpu_threads import set_default_wait_policy
from engine.engine_core import messages as m
from engine.engine_core.memory_hygiene import Trimmer, bound_cpu_shape_caches, freeze_heap
from engine.engine_core.progress import ProgressCapture

log = logging.getLogger("kvscope.engine_core")


def run_core_process(config: Any, conn: Connection) -> None:
    # Ctrl-C and a service manager's SIGTERM reach the whole process group; the server
    # stops the core in order: it closes its end, and EOF ends the loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    set_default_wait_policy()  # before torch is imported (engine.cpu_threads)
    bound_cpu_shape_caches()  # before the model's first op (memory_hygiene)
    try:
        with ProgressCapture(lambda line: conn.send_bytes(m.encode(line))):
            from engine.engine_core.startup import build_engine_core

            core = build_engine_core(config)
    except BaseException as exc:  # any load failure is reported, never raised into a void
        conn.send_bytes(m.encode(m.Answer(m.NIL, m.failure_of(exc), False, False)))
        return
    freeze_heap()  # the loaded heap (torch, the model) is never garbage (memory_hygiene)
    conn.send_bytes(m.encode(m.Answer(m.NIL, None, False, False, core.info)))
    trimmer = Trimmer()
    while True:
        try:
            name, args = m.call_decoder.decode(conn.recv_bytes())
        except EOFError:  # the engine closed its end (``close``), or its process is gone
            return
        value, failure, info = m.NIL, None, core.info
        try:
            args = m.decode_args(name, args)  # first: it refuses a name CALLS does not list
            value = msgspec.Raw(m.encode(getattr(core, name)(*args)))
        except Exception as exc:
            log.debug("engine core: %s raised", name, exc_info=exc)
            failure = m.failure_of(exc)
        conn.send_bytes(m.encode(m.Answer(value, failure, core.has_unfinished_requests(),
                                          core.has_pending_events(), None if core.info is info else core.info)))
        trimmer.tick()


def main(fd: int) -> None:
    from engine.config import EngineConfig

    conn = Connection(fd)
    try:
        config = msgspec.msgpack.decode(conn.recv_bytes(), type=EngineConfig)
        run_core_process(config, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the engine's process is gone
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]))
