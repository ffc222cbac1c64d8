"""Pods discovered from an SGLang server's ``/server_info`` (``kvscope attach --sglang URL``):
a small HTTP server answers SGLang's real field set (``ServerArgs`` flattened, with
``kv_events_config`` as the JSON *string* given to ``--kv-events-config``), and attach follows
the publisher it names."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.attach.commands import options_from_args
from engine.attach.discover import sglang_pods
from engine.cli import build_parser, main
from engine.core.errors import ConfigError
from tests.attach.fake_publisher import FakePublisher, free_port, stored
from tests.attach.helpers import start_attach, wait_until


def server_info(kv_events_config: str | None, **over) -> dict:
    """A trimmed SGLang /server_info answer: the fields as SGLang names and types them."""
    info = {"model_path": "qwen/qwen2.5-0.5b-instruct", "tokenizer_path": "qwen/qwen2.5-0.5b-instruct",
            "host": "0.0.0.0", "port": 30000, "page_size": 1, "tp_size": 1, "pp_size": 1,
            "enable_metrics": False, "kv_events_config": kv_events_config, "dp_size": 1,
            "load_balance_method": "round_robin", "nnodes": 1, "node_rank": 0, "enable_dp_attention": False,
            "disable_radix_cache": False, "served_model_name": "qwen/qwen2.5-0.5b-instruct",
            "status": "ready", "max_total_num_tokens": 20480, "version": "0.5.9"}
    info["internal_states"] = [dict(info)]
    info.update(over)
    return info


class FakeSGLang:
    """Answers /server_info (or only the older /get_server_info) and /metrics."""

    def __init__(self, info: dict, paths: tuple[str, ...] = ("/server_info", "/get_server_info")) -> None:
        owner = self
        self.info, self.paths, self.asked = info, paths, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                owner.asked.append(self.path)
                if self.path in owner.paths:
                    body, kind = json.dumps(owner.info).encode(), "application/json"
                elif self.path == "/metrics":
                    body, kind = b"# TYPE sglang:token_usage gauge\nsglang:token_usage 0.25\n", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def attach_args(*argv: str):
    return options_from_args(build_parser().parse_args(["attach", *argv]))


def test_attach_follows_the_publisher_an_sglang_server_names(tmp_path):
    pub = FakePublisher(endpoint=f"tcp://127.0.0.1:{free_port()}")
    port = pub.endpoint.rsplit(":", 1)[1]
    rport = pub.replay_endpoint.rsplit(":", 1)[1]
    cfg = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}",
                      "replay_endpoint": f"tcp://*:{rport}", "topic": "", "buffer_steps": 10000})
    fake = FakeSGLang(server_info(cfg, enable_metrics=True))
    srv = None
    try:
        (pod,) = attach_args("--sglang", fake.url, "--pod", "sg").pods
        assert (pod.pod, pod.endpoint, pod.replay, pod.topic, pod.metrics) == (
            "sg", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "", fake.url + "/metrics")
        assert fake.asked == ["/server_info"]
        srv = start_attach(tmp_path, pod)
        pub.wait_subscriber()
        pub.publish([stored([7, 8], None, [1, 2, 3, 4, 5, 6, 7, 8], 4)])
        wait_until(lambda: srv.worker.state.cached("sg") == {format(7, "016x"), format(8, "016x")},
                   what="the discovered pod's blocks")
    finally:
        if srv is not None:
            srv.stop()
        pub.close()
        fake.close()


def test_attention_dp_ranks_older_servers_and_overrides():
    cfg = '{"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}'
    fake = FakeSGLang(server_info(cfg, enable_dp_attention=True, dp_size=2), paths=("/get_server_info",))
    try:  # an older server has /get_server_info only; each attention-DP rank on PORT + rank
        pods = attach_args("--sglang", fake.url + "/").pods
        name = fake.url.removeprefix("http://")
        assert [(p.pod, p.endpoint, p.replay, p.topic, p.metrics) for p in pods] == [
            (f"{name}-dp0", "tcp://127.0.0.1:5557", None, "kv", None),
            (f"{name}-dp1", "tcp://127.0.0.1:5558", None, "kv", None)]
        assert fake.asked == ["/server_info", "/get_server_info"]
        # options after --sglang override what was found
        pods = attach_args("--sglang", fake.url, "--pod", "s", "--topic", "", "--replay", "tcp://127.0.0.1:6000",
                           "--kv-events", "tcp://127.0.0.1:1", "--pod", "other").pods
        assert [(p.pod, p.endpoint, p.replay, p.topic) for p in pods] == [
            ("s-dp0", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:6000", ""),
            ("s-dp1", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:6001", ""),
            ("other", "tcp://127.0.0.1:1", None, "")]
    finally:
        fake.close()


@pytest.mark.parametrize("cfg, over, says", [
    (None, {}, "publishes no KV events (kv_events_config is null)"),
    ('{"publisher": "null"}', {}, "publisher is 'null', not \"zmq\""),
    ("{not json", {}, "kv_events_config is not JSON"),
    ('{"endpoint": "tcp://10.0.0.9:5557"}', {}, "connects out to tcp://10.0.0.9:5557"),
    ('{"endpoint": "inproc://kv"}', {}, "inside the server's process"),
    ('{"endpoint": "tcp://*:5557"}', {"enable_dp_attention": True, "dp_size": 4, "nnodes": 2}, "on 2 nodes"),
])
def test_what_an_sglang_server_cannot_give_is_refused_by_name(cfg, over, says):
    with pytest.raises(ConfigError, match=None) as exc:
        sglang_pods("http://10.0.0.7:30000", server_info(cfg, **over))
    assert says in str(exc.value)


def test_the_default_endpoint_ipv6_hosts_and_bad_urls():
    # a config without publisher or endpoint: SGLang's defaults (zmq, tcp://*:5557)
    (p,) = sglang_pods("http://[fd00::7]:30000", server_info("{}"))
    assert (p.pod, p.endpoint) == ("[fd00::7]:30000", "tcp://[fd00::7]:5557")
    (p,) = sglang_pods("http://h:1", server_info('{"endpoint": "ipc:///tmp/sg.sock"}'))
    assert p.endpoint == "ipc:///tmp/sg.sock"
    with pytest.raises(ConfigError, match="http\\(s\\) URL"):
        sglang_pods("tcp://h:30000", server_info("{}"))


def test_the_cli_says_why_discovery_failed(capsys):
    port = free_port()  # nothing listens there
    assert main(["attach", "--sglang", f"http://127.0.0.1:{port}"]) == 2
    assert f"cannot reach http://127.0.0.1:{port}/server_info" in capsys.readouterr().err
    assert main(["attach"]) == 2
    assert "give at least one pod: --kv-events ENDPOINT or --sglang URL" in capsys.readouterr().err
    fake = FakeSGLang({"status": "ready"}, paths=())
    try:
        assert main(["attach", "--sglang", fake.url]) == 2
        assert "not an SGLang server" in capsys.readouterr().err
    finally:
        fake.close()
