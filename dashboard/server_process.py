"""A ``kvscope serve`` child process the dashboard starts when no server answers.

It runs the real server in its own interpreter (the dashboard never imports
torch), logs to a temp file so a full pipe can never stall it, and is stopped
when the dashboard exits (atexit) or when its cache entry is released.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 10.0  # the server's graceful shutdown flushes the recorder; give it time


def stop_process(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (a kvscope server then marks its run finished), SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def probe_health(url: str, timeout: float = 0.5) -> dict[str, Any] | None:
    """``/healthz`` as a dict, or None when nothing answers (or it is not a kvscope server)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(65536)
    except urllib.error.HTTPError as exc:  # a 503 while loading still carries the JSON
        try:
            body = exc.read(65536)
        except OSError:
            return None
    except (OSError, ValueError):
        return None
    try:
        d = json.loads(body)
    except ValueError:
        return None
    return d if isinstance(d, dict) and "status" in d else None


class ServerProcess:
    """One ``python -m engine.cli serve`` child; ``health()`` says how loading goes."""

    def __init__(self, host: str, port: int, model: str, extra_args: tuple[str, ...] = ()) -> None:
        self.host, self.port, self.model = host, port, model
        self.health_url = f"http://{host}:{port}/healthz"
        self.cmd = [sys.executable, "-m", "engine.cli", "serve", "--host", host,
                    "--port", str(port), "--model", model, *extra_args]
        fd, self.log_path = tempfile.mkstemp(prefix="kvscope-serve-", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        env = dict(os.environ)
        # the child must import `engine` however the dashboard itself was started
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        self.started_at = time.time()
        self.proc = subprocess.Popen(self.cmd, cwd=os.getcwd(), env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.stop)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> dict[str, Any]:
        """The server's /healthz, or a synthetic status while it binds or after it died."""
        if not self.alive():
            return {"status": "error", "detail": f"kvscope serve exited with code "
                    f"{self.proc.returncode}: {self.log_tail(6)}"}
        h = probe_health(self.health_url)
        if h is None:
            return {"status": "loading", "detail": "starting kvscope serve "
                    f"({time.time() - self.started_at:.0f} s)…"}
        return h

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (graceful: the run is marked finished), then SIGKILL after a grace period."""
        stop_process(self.proc)
        if not self._log.closed:
            self._log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
        atexit.unregister(self.stop)
