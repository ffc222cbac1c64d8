"""The websocket route's connection, as the Hub sees it, on uvicorn's websockets-sansio.

The Hub uses four things of a connection: ``async for frame in ws`` (text or bytes; ends
when the peer goes), ``send``, ``close(code, reason)`` and ``transport`` (to shrink the
socket's send buffer); ``AsgiWebSocket`` gives it those over a Starlette ``WebSocket``
on uvicorn's websocket protocol (the ``websockets`` package's sans-I/O state machine).

ASGI has no way to reach the transport, and the Hub needs it twice: to cap the kernel
send buffer (else a stalled reader hides megabytes of steps in the kernel, past the
outbox bound) and to drop a peer that stopped reading (uvicorn's close waits for the
socket to drain, which a stalled reader never lets happen). ``TransportWebSocketProtocol``
is uvicorn's websockets-sansio protocol that also puts its transport (and a flow-control
waiter, see there) in the ASGI scope's extensions.

Writer: none; one adapter per connection, used by its Hub handler and writer task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

log = logging.getLogger("kvscope.server")

SCOPE_TRANSPORT = "kvscope.transport"  # keys in scope["extensions"]
SCOPE_DRAINED = "kvscope.drained"
CLOSE_TIMEOUT_S = 2.0  # as the websockets server's close_timeout: then the TCP connection is dropped


class TransportWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, plus its transport and a "write buffer below
    the high-water mark" waiter in the ASGI scope.

    uvicorn waits for that *before* it writes a frame, websockets' own server *after*:
    the Hub's writer should block with its frame already handed to the transport, not
    holding it, so that every frame not yet written stays in the Outbox, where the
    bounds and the step dropping apply (``AsgiWebSocket.send`` waits after writing)."""

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # absent when the handshake itself was refused
        if scope is not None:
            scope["extensions"][SCOPE_TRANSPORT] = self.transport
            scope["extensions"][SCOPE_DRAINED] = self.writable.wait


def _closed(code: int | None = None, reason: str = "") -> ConnectionClosed:
    return ConnectionClosed(Close(code or 1006, reason or ""), None)


class AsgiWebSocket:
    """What the Hub uses of a websocket connection, over an accepted Starlette WebSocket."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        ext = websocket.scope["extensions"]  # TransportWebSocketProtocol's, always
        self.transport = ext[SCOPE_TRANSPORT]
        self._drained = ext[SCOPE_DRAINED]
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[str | bytes]:
        while True:
            try:
                msg = await self.websocket.receive()
            except (RuntimeError, OSError):  # receive after the close: the connection is over
                return
            if msg["type"] == "websocket.disconnect":
                self._closed = True
                return
            text = msg.get("text")
            yield text if text is not None else msg.get("bytes") or b""

    async def send(self, frame: str) -> None:
        """Send one text frame; raises ConnectionClosed once the connection is gone."""
        if self._closed or self.websocket.application_state is not WebSocketState.CONNECTED:
            raise _closed()
        try:
            await self.websocket.send_text(frame)
            await self._drained()  # flow control after the write, as websockets does
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            self._closed = True
            raise _closed(getattr(exc, "code", None)) from None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame; a peer that does not let it out in time is dropped."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self.websocket.close(code, reason), CLOSE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("kvscope: a websocket peer did not take its close frame in %.0fs; dropping it",
                        CLOSE_TIMEOUT_S)
            self.transport.abort()
        except (RuntimeError, OSError, WebSocketDisconnect):
            pass  # already closed by the peer
