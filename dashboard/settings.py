"""Dashboard settings from the environment (read once per process).

- ``KVSCOPE_URL``: websocket URL of ``kvscope serve`` (default ws://127.0.0.1:8765).
- ``KVSCOPE_MODEL``: model the dashboard serves when nothing answers at the URL.
- ``KVSCOPE_AUTOSTART``: "0" never starts a server (only connects).
- ``KVSCOPE_SERVE_ARGS``: extra ``kvscope serve`` arguments for that server.
- ``KVSCOPE_REFRESH_S``: live refresh period in seconds (default 0.5: twice a second).
- ``KVSCOPE_DB``: the runs database (read by engine.store; the started server shares it).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from engine import envs


@dataclass(frozen=True, slots=True)
class Settings:
    url: str
    model: str
    autostart: bool
    serve_args: tuple[str, ...]
    refresh_s: float

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        u = urlsplit(self.url)
        return u.port or (443 if u.scheme == "wss" else 80)

    @property
    def health_url(self) -> str:
        """``/healthz`` on the same host and port (plain HTTP next to the websocket)."""
        u = urlsplit(self.url)
        scheme = "https" if u.scheme == "wss" else "http"
        return f"{scheme}://{u.netloc}/healthz"

    @property
    def api_url(self) -> str:
        """The OpenAI API on the same port (an OpenAI client's ``base_url``)."""
        u = urlsplit(self.url)
        scheme = "https" if u.scheme == "wss" else "http"
        return f"{scheme}://{u.netloc}/v1"


def load() -> Settings:
    """Settings from the environment; invalid values fall back to defaults."""
    url = envs.URL.get()
    if not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return Settings(url=url, model=envs.MODEL.get(), autostart=envs.AUTOSTART.get(),
                    serve_args=envs.SERVE_ARGS.get(), refresh_s=max(0.1, envs.REFRESH_S.get()))
