"""The Host header rule against DNS rebinding (issue 17, "Host header"; security.HostPolicy).

A page of evil.example whose DNS the attacker re-points at 127.0.0.1 is, to the browser,
same-origin with a local server: before this (main at b923685) it could read /metrics,
/healthz and /v1/models of a token-less server and open its websocket (a same-origin
page may send no cross-site Origin). Only its Host header, ``evil.example``, tells."""

from __future__ import annotations

import pytest

from engine.cli import build_parser
from engine.client import KVScopeClient, LiveConnection
from engine.server.app import ServerOptions
from engine.server.port.security import HostPolicy, host_name
from tests.attach.fake_publisher import FakePublisher
from tests.attach.helpers import source, start_attach
from tests.server.helpers import GREEDY
from tests.server.raw_http import call, ws_handshake

TOKEN = "a-long-enough-test-token-0123456789"
EVIL = ("evil.example", "evil.example:8765", "EVIL.example.", "127.0.0.1.evil.example",
        "localhost.evil.example", "10.0.0.7")


def _refused_everywhere(port: int, host: str) -> None:
    for path in ("/metrics", "/healthz", "/"):
        r = call(port, "GET", path, host=host)
        assert r.status == 403, (path, host, r)
        assert r.json()["error"] == "host_not_allowed" and "--allowed-host" in r.json()["detail"]
    api = call(port, "GET", "/v1/models", host=host)
    assert api.status == 403 and api.json()["error"]["code"] == "host_not_allowed"
    assert api.json()["error"]["type"] == "invalid_request_error"
    ws = ws_handshake(port, host=host)
    assert ws.status == 403 and ws.json()["error"] == "host_not_allowed", ws


def _answered(port: int, host: str) -> None:
    for path in ("/metrics", "/healthz", "/v1/models", "/"):
        assert call(port, "GET", path, host=host).status == 200, (path, host)
    assert ws_handshake(port, host=host).status == 101, host


def test_a_loopback_server_answers_loopback_hosts_only(make_server):
    server = make_server()
    port = server.port
    for host in EVIL:
        _refused_everywhere(port, host)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}",
                 f"LocalHost:{port}", "127.1.2.3", f"app.localhost:{port}"):
        _answered(port, host)
    # the clients still work: the Python client, and the dashboard's LiveConnection
    with KVScopeClient(server.url, timeout=20) as c:
        assert c.generate("hi", params=GREEDY).outputs[0]["finish_reason"] == "length"
    live = LiveConnection(f"ws://localhost:{port}", timeout=20).start()
    try:
        assert live.wait_live(20)
    finally:
        live.stop()
    # a forged Host gets nothing past the door: the engine saw no op, no connection
    assert call(port, "GET", "/healthz").json()["connections"] == 0


def test_a_token_does_not_lift_the_host_rule_on_loopback(make_server):
    # /healthz needs no token; a rebinding page must not read it either
    server = make_server(token=TOKEN)
    r = call(server.port, "GET", "/healthz", host="evil.example")
    assert r.status == 403
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert call(server.port, "GET", "/metrics", host="evil.example", headers=bearer).status == 403
    assert call(server.port, "GET", "/metrics", host=f"localhost:{server.port}", headers=bearer).status == 200


def test_allowed_host_adds_names(make_server):
    server = make_server(allowed_hosts=("kvscope.lan", ".example.org"))
    port = server.port
    for host in ("kvscope.lan", f"KVSCOPE.lan:{port}", "example.org", "a.b.example.org:1",
                 f"localhost:{port}"):
        _answered(port, host)
    for host in ("evil.example", "kvscope.lan.evil", "notexample.org", "sub.kvscope.lan"):
        _refused_everywhere(port, host)


def test_attach_keeps_the_rule(tmp_path):
    pub = FakePublisher()
    server = start_attach(tmp_path, source(pub))
    try:
        _refused_everywhere(server.port, "evil.example")
        assert call(server.port, "GET", "/healthz", host=f"localhost:{server.port}").status == 200
        assert ws_handshake(server.port, host=f"127.0.0.1:{server.port}").status == 101
    finally:
        server.stop()
        pub.close()


def test_the_policy_by_bind_address():
    assert host_name("[::1]:8765") == "::1" and host_name("Foo.Bar.:80") == "foo.bar"
    assert host_name("::1") == "::1" and host_name("localhost") == "localhost"
    loop = HostPolicy.for_bind("127.0.0.1")
    assert loop.check and loop.allows("localhost:1") and not loop.allows("evil.example")
    assert loop.allows(None)  # HTTP/1.0 without Host: no browser sends that
    assert HostPolicy.for_bind("::1").check and HostPolicy.for_bind("localhost").check
    # bound elsewhere on purpose (a token is required there): no Host rule unless listed
    open_ = HostPolicy.for_bind("0.0.0.0")
    assert not open_.check and open_.allows("evil.example")
    listed = HostPolicy.for_bind("192.168.1.5", ("kvscope.lan:8765",))
    assert listed.allows("kvscope.lan") and listed.allows("192.168.1.5:8765")
    assert listed.allows("localhost") and not listed.allows("evil.example")


def test_the_flag(tiny_llama, capsys):
    args = build_parser().parse_args(["serve", "--model", tiny_llama, "--allowed-host", "a.lan",
                                      "--allowed-host", ".b.lan"])
    assert args.allowed_hosts == ["a.lan", ".b.lan"]
    attach = build_parser().parse_args(["attach", "--kv-events", "tcp://127.0.0.1:1",
                                        "--allowed-host", "c.lan"])
    assert attach.allowed_hosts == ["c.lan"]
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="--allowed-host"):
        ServerOptions(EngineConfig(model=tiny_llama), allowed_hosts=("bad host/x",))
