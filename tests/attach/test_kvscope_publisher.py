"""kvscope attach on kvscope's own publisher (``kvscope serve --kv-events-config``):
after shared-prefix requests and a cache-pressure burst, the attached run's cache is the
engine's, every eviction arrived, and the prefix lookup predicts the engine's real hit."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from engine.attach.fleet import miss_explainer, overview
from engine.attach.pod_source import PodSource
from engine.attach.prefix_match import BY_HASH, BY_TOKENS, SHA256, detect_scheme, longest_prefix
from engine.attach.tokenizer_file import resolve_tokenizer_file
from engine.client import KVScopeClient
from engine.events.schema.hash_key import hash_key
from engine.events.schema.types import BlockEvicted, EvictionReason, KVBlockRemoved, KVGap, RequestArrived
from engine.kv_events.mapping import vllm_block_hash
from engine.store.runs import RunStore
from tests.attach.fake_publisher import free_port
from tests.attach.helpers import events_of, recorded, start_attach, wait_until

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}
SYSTEM = "You are a helpful assistant. Answer in one short sentence, please. "
POD = "kvscope-0"


@pytest.fixture(scope="module")
def tiny_llama() -> str:
    from tests.tiny_models import tiny_model_dir

    return str(tiny_model_dir("llama"))


def engine_cached(client: KVScopeClient) -> set[str]:
    """The engine's cached blocks, named as its KV event stream names them."""
    snap = client.snapshot().state
    return {hash_key(vllm_block_hash(b.hash)) for b in snap.blocks if b.hash is not None}


def serve(model: str, tmp_path: Path, endpoint: str, replay: str) -> tuple[subprocess.Popen, str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
              "replay_endpoint": replay}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("KVSCOPE_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "serve", "--model", model, "--port", "0",
         "--db", str(tmp_path / "serve.sqlite"), "--block-size", "4", "--num-kv-blocks", "48",
         "--max-model-len", "128", "--kv-events-config", json.dumps(config)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    log = []
    while True:
        try:
            log.append(lines.get(timeout=120))
        except queue.Empty:
            proc.kill()
            raise AssertionError("kvscope serve did not start:\n" + "".join(log)) from None
        m = re.search(r"serving (ws://127\.0\.0\.1:\d+)", log[-1])
        if m:
            return proc, m.group(1)


def test_attach_follows_kvscope_serve_exactly(tiny_llama, tmp_path):
    endpoint = f"ipc://{tmp_path}/kv.sock"  # ipc binds, loopback only; attach connects
    replay = f"tcp://127.0.0.1:{free_port()}"
    proc, url = serve(tiny_llama, tmp_path, endpoint, replay)
    metrics = url.replace("ws://", "http://") + "/metrics"
    tokenizer = resolve_tokenizer_file(tiny_llama)
    srv = None
    try:
        client = KVScopeClient(url, timeout=60)
        client.connect(wait=120)
        srv = start_attach(tmp_path, PodSource(POD, endpoint, replay, "", metrics),
                           tokenizer_file=tokenizer, label="kvscope pod")
        wait_until(lambda: srv.scrapers[POD].version >= 1, what="the first scrape (the baseline)")
        with client:
            for q in ("what is a block?", "what is a page?", "and a cache?", "and a hash?"):
                client.generate(SYSTEM + q, params=GREEDY)
            # a cache-pressure burst: distinct prompts that together need more than 48 blocks
            rids = [client.submit(f"Burst {i}: " + "tell me about paging in a long way " * 2,
                                  params=GREEDY) for i in range(8)]
            for rid in rids:
                for _ in client.stream(rid):
                    pass
            client.generate(SYSTEM + "after the burst?", params=GREEDY)  # the prefix, cached again
            want = engine_cached(client)
            wait_until(lambda: srv.worker.state.cached(POD) == want, timeout=30,
                       what="the attached cache to equal the engine's")
            assert len(want) >= 10

            # the prompt box: tokenize, chain-hash, look up; then send it and compare
            prompt = SYSTEM + "what is a slot?"
            ids = Tokenizer.from_file(tokenizer).encode(prompt).ids
            pod = srv.worker.state.to_snapshot().pods[POD]
            assert detect_scheme(pod) == SHA256  # kvscope's default: vLLM's hashes
            by_hash = longest_prefix(pod, ids, SHA256)
            by_tokens = longest_prefix(pod, ids, None)
            assert (by_hash.method, by_tokens.method) == (BY_HASH, BY_TOKENS)
            assert by_hash.hashes == by_tokens.hashes and by_hash.num_blocks >= 4
            done = client.generate(prompt, params=GREEDY, request_id="probe")
            assert done.metrics["num_prompt_tokens"] == len(ids)
            assert done.metrics["num_cached_tokens"] == by_hash.hit_tokens > 0
            wait_until(lambda: srv.worker.state.cached(POD) == engine_cached(client), timeout=30,
                       what="the cache after the probe")
        wait_until(lambda: srv.scrapers[POD].latest().get("ttft_count", 0) >= 14,
                   what="a scrape after the last request")
    finally:
        if srv is not None:
            srv.stop()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    run, records = recorded(srv)
    assert run["kind"] == "attached" and not events_of(records, KVGap)
    # every eviction arrived: the engine's recorded evictions, hash for hash
    store = RunStore(str(tmp_path / "serve.sqlite"))
    serve_run = store.list_runs()[0]["id"]
    serve_steps = store.load_steps(serve_run)
    evicted = Counter(hash_key(vllm_block_hash(e.hash)) for r in serve_steps for e in r.events
                      if isinstance(e, BlockEvicted) and e.reason is not EvictionReason.RESET)
    removed = Counter(h for e in events_of(records, KVBlockRemoved) for h in e.block_hashes)
    assert sum(evicted.values()) > 10, "the burst should evict"
    assert removed == evicted
    # the engine tokenized the probe as the prompt box did
    arrived = next(e for r in serve_steps for e in r.events
                   if isinstance(e, RequestArrived) and e.request_id == "probe")
    assert list(arrived.prompt_token_ids) == ids
    scraped = records[-1].metrics["scraped"][POD]
    assert 0 <= scraped["kv_cache_usage"] <= 1 and scraped["prefix_cache_hits"] > 0
    assert scraped["ttft_count"] >= 1 and scraped["prefix_cache_hit_rate"] > 0
    # the miss explainer beside the engine's own causes, scraped from its /metrics: the engine's
    # cold / evicted / partial add up to its missed tokens, the events' causes to the blocks stored
    engine = {c: scraped[f"prefix_cache_miss_{c}"] for c in ("cold", "evicted", "partial")}
    assert sum(engine.values()) == scraped["prefix_cache_queries"] - scraped["prefix_cache_hits"]
    assert engine["cold"] > 0 and engine["partial"] > 0
    row = srv.worker.fleet[POD]
    assert sum(row["miss_tokens"].values()) == (row["placed_blocks"] - row["achieved_blocks"]) * row["block_size"] > 0
    (ex,) = miss_explainer({POD: {**row, "scraped": scraped}})
    assert ex["engine"] == engine and ex["events_as_engine"]["cold"] > 0
    # token usage: a kvscope pod exports it exactly, and the fleet page shows that, not a bound
    assert 0 <= scraped["kv_token_usage"] <= scraped["kv_cache_usage"] and scraped["num_gpu_blocks"] > 0
    (ov,) = overview({POD: {**row, "scraped": scraped}}, 0.0)
    assert ov["token_usage_low"] == ov["token_usage_high"] == scraped["kv_token_usage"]
