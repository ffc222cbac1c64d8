"""Who may reach the server: the bind policy and the shared-token check.

Policy: the server binds loopback by default. Any other address needs both
``--allow-remote`` and a token in ``KVSCOPE_TOKEN``; otherwise it refuses to
start. When a token is set (on any address) every websocket connection, every
OpenAI API call and every ``/metrics`` scrape must present it, as ``?token=`` or
``Authorization: Bearer`` (an OpenAI client's api_key); ``/healthz`` stays open so
probes need no secret. Browsers may only connect or call from a localhost page
(Origin check), so a website the user visits cannot drive a local engine.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from urllib.parse import parse_qs, urlsplit

from engine.protocol.handshake import TOKEN_ENV

# No Origin (scripts, the Python client) or a page served from this machine.
ALLOWED_ORIGINS = [None, re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?")]


class BindRefused(Exception):
    """The host/token combination is not allowed; the message says what to do."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname other than localhost may resolve anywhere


def check_bind(host: str, allow_remote: bool, token: str | None) -> None:
    """Raise BindRefused unless binding ``host`` is allowed."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise BindRefused(f"refusing to bind {host!r}: the server is for this machine by default. "
                          f"To accept remote clients pass --allow-remote and set {TOKEN_ENV}.")
    if not token:
        raise BindRefused(f"refusing to bind {host!r} with --allow-remote but no token: set "
                          f"{TOKEN_ENV} to a secret every client must present.")
    if len(token) < 16:
        raise BindRefused(f"{TOKEN_ENV} is too short for a network-facing server (use >= 16 characters)")


def presented_token(path: str, authorization: str | None) -> str | None:
    """The token a request carries (Authorization: Bearer wins over ?token=)."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    values = parse_qs(urlsplit(path).query).get("token")
    return values[0] if values else None


def token_ok(expected: str | None, path: str, authorization: str | None) -> bool:
    """True when no token is required or the request carries the right one."""
    if not expected:
        return True
    got = presented_token(path, authorization)
    return got is not None and hmac.compare_digest(got.encode(), expected.encode())
