"""Scraper: one pod's ``/metrics``, every ``interval_s``, on its own thread.

Each scrape is folded by ``ScrapeFold`` (``engine.attach.prom_scrape``); ``latest()``
hands the worker the figures so far, with ``scrape_ts`` and, when the last scrape
failed, ``error`` (the figures of the last good one stay). ``version`` grows with
every scrape, so the worker can tell a fresh reading from one it already recorded.

Writer: this thread (the fold, ``_latest`` swapped whole under the lock).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from engine.attach.prom_scrape import ScrapeFold, read_sample

log = logging.getLogger("kvscope.attach")

TIMEOUT_S = 2.0
MAX_BYTES = 32 << 20  # a /metrics page past this is not one


class Scraper(threading.Thread):
    def __init__(self, pod: str, url: str, interval_s: float = 1.0) -> None:
        super().__init__(name=f"kvscope-scrape-{pod}", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.pod, self.url, self.interval_s = pod, url, interval_s
        self._fold = ScrapeFold()
        self._lock = threading.Lock()
        self._latest: dict[str, Any] = {}
        self.version = 0
        self.failures = 0
        self._stopping = threading.Event()

    def latest(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def scrape_once(self) -> None:
        error = None
        try:
            with urllib.request.urlopen(self.url, timeout=TIMEOUT_S) as resp:
                text = resp.read(MAX_BYTES + 1).decode("utf-8", errors="replace")
            if len(text) > MAX_BYTES:
                raise ValueError(f"the page is over {MAX_BYTES} bytes")
            self._fold.add(read_sample(text))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            if self.failures in (1, 10, 100, 1000):
                log.warning("kvscope attach: scraping %s for pod %s failed (%s); %d failures so far",
                            self.url, self.pod, error, self.failures)
        figures = self._fold.figures()
        figures["scrape_ts"] = time.time()
        if error is not None:
            figures["error"] = error
        with self._lock:
            self._latest = figures
            self.version += 1
