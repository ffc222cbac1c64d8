"""Idle memory of ``kvscope serve``'s process tree (issue 29's figure in bench/RESULTS.md, "Soak").

    python -m bench.idle_rss                              # the core in a child (serve's default)
    python -m bench.idle_rss --engine-core-in-process     # one process

Starts the server as ``bench.soak`` does, with the soak's tiny-model settings, serves one
8-token request over the websocket, waits 5 s and prints each process's resident memory
(``/proc/PID/status`` VmRSS) and the sum. Extra arguments go to ``kvscope serve``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from bench.mem_probe import rss_mb
from bench.soak import _children, _start_server
from engine.client import KVScopeClient
from tests.tiny_models import tiny_model_dir

SETTINGS = ["--block-size", "16", "--num-kv-blocks", "256", "--max-model-len", "256"]


def main(argv: list[str]) -> int:
    db = os.path.join(tempfile.mkdtemp(prefix="kvscope-rss-"), "runs.sqlite")
    proc, port = _start_server(str(tiny_model_dir("llama")), db, SETTINGS + argv)
    try:
        with KVScopeClient(f"ws://127.0.0.1:{port}") as c:
            c.generate("hello there", params={"max_tokens": 8, "temperature": 0})
        time.sleep(5)
        pids = [proc.pid, *_children(proc.pid)]
        total = 0.0
        for pid in pids:
            mb = rss_mb(pid)
            total += mb
            with open(f"/proc/{pid}/cmdline") as f:
                print(f"{mb:8.1f} MB  {f.read().replace(chr(0), ' ')[:80]}")
        print(f"{total:8.1f} MB  total")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
