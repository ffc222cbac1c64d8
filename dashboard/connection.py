"""The dashboard's link to ``kvscope serve``: find or start a server, keep one client.

Resources are process-wide (``st.cache_resource``), so every browser tab shares
one server child, one websocket connection (its background thread folds the
steps) and one LiveFeed, which fills its gaps through that connection
(``steps_since``), never from the database. If nothing answers at ``KVSCOPE_URL`` the dashboard
starts ``python -m engine.cli serve`` itself (the model from ``KVSCOPE_MODEL``),
and stops it when the dashboard exits.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import streamlit as st

from engine import envs
from engine.client import LiveConnection
from engine.events.schema.step import StepRecord

from dashboard.live_feed import LiveFeed
from dashboard.server_process import ServerProcess, probe_health
from dashboard.settings import Settings, load as load_settings


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What /healthz says, and whether this dashboard started the server."""

    health: dict[str, Any] | None  # None: nothing answers and nothing was started
    managed: ServerProcess | None

    @property
    def status(self) -> str:
        return "unreachable" if self.health is None else str(self.health.get("status"))

    @property
    def detail(self) -> str:
        return "" if self.health is None else str(self.health.get("detail") or "")


class _ManagedServer:
    """Holds the server child this dashboard started (at most one per URL)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.proc: ServerProcess | None = None

    def get_or_start(self, cfg: Settings) -> ServerProcess:
        with self._lock:  # two tabs loading at once must not start two servers
            if self.proc is None:
                self.proc = ServerProcess(cfg.host, cfg.port, cfg.model, cfg.serve_args)
            return self.proc

    def stop(self) -> None:
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            proc.stop()


@st.cache_resource(show_spinner=False, on_release=lambda m: m.stop())
def _managed(url: str) -> _ManagedServer:
    return _ManagedServer()


@st.cache_resource(show_spinner=False, on_release=lambda c: c.stop())
def _connection(url: str, token: str | None) -> LiveConnection:
    return LiveConnection(url, token).start()


STEPS_SINCE_TIMEOUT_S = 10.0  # a gap of the live run, read from the server's buffer or recording


def _steps_since(run_id: str, seq: int, until: int) -> list[StepRecord]:
    # Resolved per call: the connection may have been released and made anew.
    return connection().steps_since(seq, run_id, until=until, timeout=STEPS_SINCE_TIMEOUT_S)


@st.cache_resource(show_spinner=False)
def _feed(url: str) -> LiveFeed:
    return LiveFeed(_steps_since)


def settings() -> Settings:
    return load_settings()


def server_status() -> ServerStatus:
    """Probe the configured server; start one when none answers (and autostart is on)."""
    cfg = settings()
    holder = _managed(cfg.url)
    health = probe_health(cfg.health_url)
    if health is not None:  # ours (started earlier) or someone else's
        return ServerStatus(health, holder.proc)
    if holder.proc is not None and not holder.proc.alive():
        return ServerStatus(holder.proc.health(), holder.proc)  # died: show why, no respawn loop
    if not cfg.autostart:
        return ServerStatus(None, None)
    proc = holder.get_or_start(cfg)
    return ServerStatus(proc.health(), proc)


def restart_managed_server() -> None:
    """Stop the child this dashboard started (if any); the next status check starts anew."""
    _managed(settings().url).stop()


def connection() -> LiveConnection:
    """The shared websocket client (its thread retries while the server loads)."""
    cfg = settings()
    return _connection(cfg.url, envs.TOKEN.get())


def feed() -> LiveFeed:
    return _feed(settings().url)


def attached() -> bool:
    """True when the server is ``kvscope attach`` (a watched deployment, read-only)."""
    config = connection().view().config or {}
    return config.get("kind") == "attached"
