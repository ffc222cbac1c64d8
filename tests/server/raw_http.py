"""HTTP/1.1 over a bare socket: what a test needs to see exactly what goes on the wire
(HEAD bodies, Allow headers, a forged Host header), which urllib would hide or fix."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field

WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455's sample key


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    rest: bytes = field(default=b"", repr=False)  # bytes after this response on the connection

    def json(self):
        return json.loads(self.body)


def request(method: str, path: str, *, host: str | None = None, headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def exchange(port: int, *requests: bytes, timeout: float = 10.0) -> bytes:
    """Send the requests on one connection and read until the server closes it (the
    last request should say ``Connection: close``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(requests))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def parse(data: bytes, head: bool = False) -> RawResponse:
    """The first response in ``data``: its body is ``content-length`` bytes (none for a
    HEAD, whatever the length says); ``rest`` is what follows."""
    top, _, after = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = 0 if head or status == 101 else int(headers.get("content-length", len(after)))
    return RawResponse(status, headers, after[:n], after[n:])


def call(port: int, method: str, path: str, *, host: str | None = None,
         headers: dict | None = None) -> RawResponse:
    """One request on its own connection; ``host`` defaults to 127.0.0.1:PORT."""
    hdrs = {"Connection": "close", **({"Content-Length": "0"} if method in ("POST", "PUT", "PATCH")
                                      else {}), **(headers or {})}
    data = exchange(port, request(method, path, host=host or f"127.0.0.1:{port}", headers=hdrs))
    return parse(data, head=method == "HEAD")


def ws_handshake(port: int, path: str = "/", host: str | None = None,
                 headers: dict | None = None) -> RawResponse:
    """A websocket opening handshake; returns the server's answer (101, or a refusal)."""
    hdrs = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": WS_KEY,
            "Sec-WebSocket-Version": "13", **(headers or {})}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request("GET", path, host=host or f"127.0.0.1:{port}", headers=hdrs))
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return parse(data)


def _complete(data: bytes) -> bool:
    r = parse(data)
    return r.status == 101 or len(r.body) >= int(r.headers.get("content-length", 0))
