"""The one port on uvicorn: websocket and HTTP side by side, the websocket's transport
reached (send buffer cap, hard drop), close 1001 on shutdown."""

import asyncio
import json
import socket

import pytest
from websockets.exceptions import ConnectionClosed

from engine.server.websocket.hub import HubLimits
import engine.server.port.ws_adapter as wa
from engine.server.port.ws_adapter import AsgiWebSocket
from tests.server.helpers import healthz, http_get, raw, recv_until


def test_websocket_and_http_share_the_port(make_server):
    server = make_server()
    ws = raw(server.url)
    status, text = http_get(server.port, "/")
    assert status == 200 and "websocket" in text and "/v1" in text
    status, text = http_get(server.port, "/v1/models")
    assert status == 200 and json.loads(text)["data"][0]["id"] == server.options.model_name
    h = healthz(server.port)
    assert h["connections"] == 1 and h["api_calls"] == 0
    (conn,) = server.hub.conns.values()
    sock = conn.ws.transport.get_extra_info("socket")  # uvicorn's transport reached the Hub
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * HubLimits().socket_send_buffer
    # Nagle off, as websockets' own server had it: with it on, every small frame after the
    # first waited for the client's delayed ACK (a watcher's snapshot answered 40 ms late)
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    ws.close()


def test_graceful_stop_closes_websockets_with_1001(make_server):
    server = make_server()
    ws = raw(server.url)
    server.stop()
    with pytest.raises(ConnectionClosed) as closed:
        recv_until(ws, lambda m: False, timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


class _Transport:
    aborted = False

    def abort(self):
        self.aborted = True


class _StuckWebSocket:
    """A Starlette WebSocket whose close never gets its frame out (a peer that stopped reading)."""

    scope = {"extensions": {wa.SCOPE_TRANSPORT: _Transport(), wa.SCOPE_DRAINED: None}}

    async def close(self, code, reason):
        await asyncio.sleep(3600)


def test_close_drops_a_peer_that_does_not_take_the_close_frame(monkeypatch):
    monkeypatch.setattr(wa, "CLOSE_TIMEOUT_S", 0.05)
    ws = AsgiWebSocket(_StuckWebSocket())
    asyncio.run(ws.close(1008, "slow_client"))
    assert ws.transport.aborted
    with pytest.raises(ConnectionClosed):
        asyncio.run(ws.send("after close"))
