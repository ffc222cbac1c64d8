"""Submits a preset's waves on a background thread.

A wave goes out once every request of the previous wave has produced its first
token, so the later waves find the earlier prompts in the prefix cache. The
thread only calls the thread-safe LiveConnection; the page reads ``request_ids``
and ``error`` (appended/set here, read elsewhere: plain attribute swaps).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.client import ServerError

from dashboard.presets import Submission, Workload

FIRST_TOKEN_TIMEOUT_S = 300.0  # a cold CPU prefill of a long prompt can take a while


def submit_one(conn: Any, feed: Any, sub: Submission) -> str:
    """Send one submission; the feed remembers its max_tokens for the baseline."""
    rid = conn.submit(prompt=sub.prompt, messages=sub.messages, params=dict(sub.params))
    feed.note_submission(rid, sub.params)
    return rid


class PresetRunner:
    """One preset being submitted; ``done`` once every wave went out (or it failed)."""

    def __init__(self, conn: Any, feed: Any, workload: Workload) -> None:
        self.conn, self.feed, self.workload = conn, feed, workload
        self.request_ids: list[str] = []
        self.error: str | None = None
        self.done = False
        self.wave = 0
        self._thread = threading.Thread(target=self._run, name="kvscope-preset", daemon=True)

    def start(self) -> PresetRunner:
        self._thread.start()
        return self

    def _started(self, rid: str) -> bool:
        p = self.conn.outputs(rid)
        return p is None or bool(p.token_ids) or p.finished is not None or p.error is not None

    def _run(self) -> None:
        try:
            for i, wave in enumerate(self.workload.waves):
                self.wave = i + 1
                # concurrently: each submit waits for its own `accepted`, and a wave should
                # reach the engine in one step (a burst), not one request per step
                with ThreadPoolExecutor(max_workers=min(len(wave), 16)) as pool:
                    ids = list(pool.map(lambda s: submit_one(self.conn, self.feed, s), wave))
                self.request_ids = self.request_ids + ids
                if i + 1 < len(self.workload.waves):
                    deadline = time.monotonic() + FIRST_TOKEN_TIMEOUT_S
                    while not all(self._started(r) for r in ids):
                        if time.monotonic() > deadline:
                            raise TimeoutError("the previous wave produced no first token in "
                                               f"{FIRST_TOKEN_TIMEOUT_S:.0f} s")
                        time.sleep(0.05)
        except (ServerError, TimeoutError, OSError) as exc:
            self.error = str(exc)
        finally:
            self.done = True
