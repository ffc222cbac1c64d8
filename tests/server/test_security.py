"""Token, bind policy and origin checks."""

import pytest
from websockets.exceptions import InvalidStatus

from engine.cli import main as cli_main
from engine.config import EngineConfig
from engine.server.app import ServerOptions
from engine.client import KVScopeClient, ServerError
from engine.client.connect import ws_connect
from engine.server.port.security import BindRefused
from tests.server.helpers import GREEDY, http_get

TOKEN = "a-long-enough-test-token-0123456789"


def test_token_required_on_websocket_and_metrics_but_not_healthz(make_server):
    server = make_server(token=TOKEN)
    for token in (None, "wrong-token"):
        with pytest.raises(ServerError) as err:
            KVScopeClient(server.url, token=token, timeout=5).connect()
        assert err.value.code == "unauthorized"
    with KVScopeClient(server.url, token=TOKEN, timeout=20) as c:  # Authorization: Bearer
        assert c.generate("hi", params=GREEDY).outputs[0]["finish_reason"] == "length"
    ws = ws_connect(f"{server.url}/?token={TOKEN}", close_timeout=1)  # ?token=
    ws.close()
    assert http_get(server.port, "/metrics")[0] == 401
    assert http_get(server.port, f"/metrics?token={TOKEN}")[0] == 200
    assert http_get(server.port, "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert http_get(server.port, "/healthz")[0] == 200


def test_browser_pages_from_elsewhere_are_refused(make_server):
    server = make_server()
    with pytest.raises(InvalidStatus) as err:
        ws_connect(server.url, origin="https://evil.example", close_timeout=1)
    assert err.value.response.status_code == 403
    ws_connect(server.url, origin="http://localhost:8501", close_timeout=1).close()  # the dashboard


def test_remote_bind_needs_allow_remote_and_a_token(tiny_llama, monkeypatch, capsys):
    cfg = EngineConfig(model=tiny_llama)
    with pytest.raises(BindRefused, match="--allow-remote"):
        ServerOptions(cfg, host="0.0.0.0")
    with pytest.raises(BindRefused, match="KVSCOPE_TOKEN"):
        ServerOptions(cfg, host="0.0.0.0", allow_remote=True)
    ServerOptions(cfg, host="0.0.0.0", allow_remote=True, token=TOKEN)  # allowed (not started)
    monkeypatch.delenv("KVSCOPE_TOKEN", raising=False)
    assert cli_main(["serve", "--model", tiny_llama, "--host", "0.0.0.0", "--allow-remote"]) == 2
    assert "KVSCOPE_TOKEN" in capsys.readouterr().err
