"""Who may reach the server: the bind policy and the shared-token check.

Policy: the server binds loopback by default. Any other address needs both
``--allow-remote`` and a token in ``KVSCOPE_TOKEN``; otherwise it refuses to
start. When a token is set (on any address) every websocket connection, every
OpenAI API call and every ``/metrics`` scrape must present it, as ``?token=`` or
``Authorization: Bearer`` (an OpenAI client's api_key); ``/healthz`` stays open so
probes need no secret. Browsers may only connect or call from a localhost page
(Origin check), so a website the user visits cannot drive a local engine.

DNS rebinding (``HostPolicy``): a page of evil.example whose name the attacker then
points at 127.0.0.1 is same-origin with the local server as far as the browser knows,
sends no cross-site Origin on a GET, and reads the answers. Only the Host header
gives it away (``evil.example:8765``). So a server bound to loopback answers only
requests whose Host is a loopback name or address (``localhost``, ``*.localhost``,
127.0.0.0/8, ``::1``; any port) or a name the operator added with
``--allowed-host``; others get 403, as Jupyter (``allow_remote_access``), Vite
(``server.allowedHosts``) and Rails (``HostAuthorization``) answer them. It holds with
a token too (``/healthz`` needs none). A server bound elsewhere was exposed on
purpose and must have a token (``check_bind``); its Host is checked only when the
operator lists ``--allowed-host`` names (then those, the bound address and loopback).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from engine import envs

LOCAL_ORIGIN = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?")


class BindRefused(Exception):
    """The host/token combination is not allowed; the message says what to do."""


def origin_allowed(origin: str | None) -> bool:
    """The Origin rule: no Origin (scripts, the Python client) or a page of this machine."""
    return origin is None or LOCAL_ORIGIN.fullmatch(origin) is not None


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
                          f"To accept remote clients pass --allow-remote and set {envs.TOKEN.name}.")
    if not token:
        raise BindRefused(f"refusing to bind {host!r} with --allow-remote but no token: set "
                          f"{envs.TOKEN.name} to a secret every client must present.")
    if len(token) < 16:
        raise BindRefused(f"{envs.TOKEN.name} is too short for a network-facing server (use >= 16 characters)")


def check_allowed_hosts(names) -> tuple[str, ...]:
    """The ``--allowed-host`` names as a tuple; ValueError for one that is not a host name."""
    names = (names,) if isinstance(names, str) else tuple(names)
    for n in names:
        if not isinstance(n, str) or not re.fullmatch(r"\.?[A-Za-z0-9._:\[\]-]+", n.strip()):
            raise ValueError(f"--allowed-host takes a host name or address (a leading dot allows "
                             f"a domain and its subdomains), got {n!r}")
    return names


def token_ok(expected: str | None, path: str, authorization: str | None) -> bool:
    """True when no token is required or the request carries the right one
    (``Authorization: Bearer`` wins over ``?token=``)."""
    if not expected:
        return True
    if authorization and authorization.lower().startswith("bearer "):
        got = authorization[7:].strip()
    else:
        got = (parse_qs(urlsplit(path).query).get("token") or [None])[0]
    return got is not None and hmac.compare_digest(got.encode(), expected.encode())


def host_name(header: str) -> str:
    """The name in a Host header, without its port or brackets, lower case:
    ``localhost:8765`` -> ``localhost``, ``[::1]:80`` -> ``::1``, ``Evil.Example.`` ->
    ``evil.example`` (a trailing dot names the same host)."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1:h.find("]")] if "]" in h else h[1:]
    elif h.count(":") == 1:  # name:port (a bare IPv6 address has more colons)
        h = h.split(":", 1)[0]
    return h[:-1] if h.endswith(".") else h


def is_loopback_name(name: str) -> bool:
    """``localhost``, a name under ``.localhost`` (RFC 6761: resolvers and browsers answer
    those with loopback themselves, so no DNS can rebind them), or a loopback address."""
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host headers the port answers (see the module docstring).

    ``extra``: the operator's ``--allowed-host`` names; one starting with a dot allows
    that domain and every name under it (``.example.com``), as Vite's list does."""

    check: bool
    extra: tuple[str, ...] = ()

    @classmethod
    def for_bind(cls, host: str, allowed_hosts: tuple[str, ...] = ()) -> HostPolicy:
        extra = tuple(dict.fromkeys(h if h.startswith(".") else host_name(h)
                                    for h in (a.strip().lower() for a in allowed_hosts) if h))
        if is_loopback(host):
            return cls(True, extra)
        # exposed on purpose: the token guards it, the list only when the operator gives one
        return cls(bool(extra), extra + (host_name(host),) if extra else ())

    def allows(self, header: str | None) -> bool:
        """True for an allowed Host. No Host header at all passes: HTTP/1.0 scripts may
        omit it, and a browser (the only rebinding vector) always sends one."""
        if not self.check or header is None:
            return True
        name = host_name(header)
        if is_loopback_name(name):
            return True
        for allowed in self.extra:
            if name == allowed or (allowed.startswith(".") and (name == allowed[1:] or name.endswith(allowed))):
                return True
        return False

    def refusal(self, header: str | None) -> str:
        return (f"this server does not answer for host {header!r} (a page whose DNS name points "
                f"at this machine, a DNS rebinding attack, would look like this). Use "
                f"http://localhost:PORT or http://127.0.0.1:PORT, or start the server with "
                f"--allowed-host {host_name(header or '') or 'NAME'} to allow that name.")
