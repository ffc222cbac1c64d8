"""``kvscope serve --kv-events-config``: a live server's KV events, end to end."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.kv_events.config import KVEventsConfig
from engine.server.app import KVScopeServer, ServerOptions
from engine.client import KVScopeClient, ServerError
from tests.kv_events.subscriber import Subscriber
from tests.kv_events.test_mapping import vllm_int
from tests.kv_events.test_publisher import free_port

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"temperature": 0.0, "max_tokens": 5, "ignore_eos": True}
SYSTEM = "You are a helpful assistant who answers briefly. "


def cached_in(snapshot) -> set[int]:
    """The cached blocks of a server ``snapshot`` message, as the stream's hashes."""
    return {vllm_int(b.hash) for b in snapshot.state.blocks if b.hash is not None}


def settle(sub: Subscriber, expected: set[int], timeout: float = 20.0) -> None:
    """Read (filling gaps through replay) until the stream's cache equals ``expected``."""
    deadline = time.monotonic() + timeout
    while sub.hashes != expected:
        if not sub.pump(0.1) and sub.replay_endpoint is not None:
            sub.fill(sub.next_seq)
        assert time.monotonic() < deadline, f"stream {len(sub.hashes)} blocks, engine {len(expected)}"


def _lines(proc) -> "queue.Queue[str]":
    q: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in proc.stdout], daemon=True).start()
    return q


def _serve(tiny_llama, tmp_path, *extra):
    env = {**os.environ, "KVSCOPE_DB": str(tmp_path / "runs.sqlite"), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    env.pop("KVSCOPE_TOKEN", None)
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", tiny_llama, "--port", "0",
           "--block-size", "4", "--num-kv-blocks", "48", "--max-model-len", "128", *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kvscope_serve_publishes_its_cache_and_shuts_down_cleanly(tiny_llama, tmp_path):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(replay=replay, topic=b"kv@test")
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": sub.endpoint,
              "replay_endpoint": replay, "topic": "kv@test"}
    proc = _serve(tiny_llama, tmp_path, "--kv-events-config", json.dumps(config))
    log: list[str] = []
    try:
        lines = _lines(proc)
        url = None
        while url is None:
            log.append(lines.get(timeout=120))
            m = re.search(r"serving (ws://127\.0\.0\.1:\d+)", log[-1])
            url = m and m.group(1)
        client = KVScopeClient(url, timeout=60)
        client.connect(wait=120)
        with client:
            for q in ("what is a block?", "what is a page?", "and a cache?"):
                client.generate(SYSTEM + q, params=GREEDY)
            settle(sub, cached_in(client.snapshot()))
            assert len(sub.hashes) >= 6 and {k for _, k in sub.log} == {"BlockStored"}
            client.reset_prefix_cache()
            client.generate(SYSTEM + "again", params=GREEDY)
            snap = client.snapshot()
            settle(sub, cached_in(snap))
            assert "AllBlocksCleared" in {k for _, k in sub.log}
            for b in snap.state.blocks:
                if b.hash is not None:
                    assert sub.tokens[vllm_int(b.hash)] == tuple(b.token_ids)
            assert set(sub.topics.values()) == {b"kv@test"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sub.close()
    assert sub.batches, "".join(log)


@pytest.mark.parametrize("extra, message", [
    (["--kv-events-config", '{"enable_kv_cache_events": true, "bogus": 1}'], "unknown field(s) 'bogus'"),
    (["--kv-events-config", "{not json"], "not valid JSON"),
    (["--no-prefix-caching", "--kv-events-config", '{"enable_kv_cache_events": true}'], "need prefix caching"),
    (["--kv-events-config", '{"enable_kv_cache_events": true}'],  # vLLM's default: tcp://*:5557
     "refusing to bind KV events on tcp://*:5557"),
])
def test_bad_kv_events_config_fails_before_loading(tiny_llama, capsys, extra, message):
    from engine.cli import main

    assert main(["serve", "--model", tiny_llama, "--port", "0", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope serve: ") and message in err


def test_a_restart_keeps_one_stream_and_clears_it(tiny_llama, tmp_path):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(replay=replay)
    kv = KVEventsConfig(enable_kv_cache_events=True, endpoint=sub.endpoint, replay_endpoint=replay)
    cfg = EngineConfig(model=tiny_llama, block_size=4, num_kv_blocks=48, max_model_len=128,
                       kv_events_config=kv)
    server = KVScopeServer(ServerOptions(cfg, port=0, db=str(tmp_path / "runs.sqlite"))).start()
    try:
        assert server.wait_ready(60).status.value == "ready"
        publisher = server.worker.engine.kv_events
        with KVScopeClient(server.url, timeout=60) as client:
            client.generate(SYSTEM + "first run", params=GREEDY)
            settle(sub, cached_in(client.snapshot()))
            before = sub.next_seq
            client.restart({"num_kv_blocks": 40})
            client.generate(SYSTEM + "second run", params=GREEDY)
            settle(sub, cached_in(client.snapshot()))
            assert server.worker.engine.kv_events is publisher  # one stream: seq goes on
            after = [k for seq, k in sub.log if seq >= before]
            assert after[0] == "AllBlocksCleared" and "BlockStored" in after
            with pytest.raises(ServerError, match="need prefix caching"):
                client.restart({"enable_prefix_caching": False})  # the old engine keeps serving
            assert server.worker.engine.kv_events is publisher and not publisher.closed
    finally:
        server.stop()
        sub.close()
    assert publisher.closed and not publisher._thread.is_alive()
