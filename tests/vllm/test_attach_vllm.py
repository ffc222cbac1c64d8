"""``kvscope attach`` on a real vLLM 0.32 pod (its KV events, its replay, its /metrics).

One vllm serve with a tiny pool (16 usable blocks of 32 tokens, so ``--max-model-len 512``: vLLM
refuses a pool smaller than one request of max_model_len), events and replay on ipc://.
An attach server (in-process, recording) and an independent pyzmq subscriber
(tests/vllm/kv_stream.py) watch it while a workload runs, all prompts as token ids:

1. R1: a 72-token prompt P, 40 tokens generated: blocks b0, b1 (prompt) and b2 (8 prompt
   tokens, 24 generated) are cached.
2. R2: P again. It hits b0 and b1; decoding fills a new block with b2's tokens, so vLLM holds
   b2's hash in two physical blocks and sends BlockStored for it twice.
3. One-block requests of fresh tokens walk vLLM's LRU free queue, one eviction each, until
   the first of b2's copies is evicted (BlockRemoved for its hash) while the other stays.
4. The probe: P + R1's output + 20 tokens. The prompt box (``engine.attach.prefix_match``,
   by vLLM's sha256 hashes) and attach's ``POST /locate`` (``engine.attach.locator``) predict
   vLLM's hit and say where the chain breaks (block 3: never stored, as no request reached
   128 tokens), then the probe is sent.

The same attach follows four more pods beside it, so the fleet microscope is checked on five
pods at once with a real vLLM among them: a kvscope engine (the tiny Llama, in process, publishing
through engine.kv_events; the probe's ``hit_tokens`` there must equal the engine's own
``num_cached_tokens``) and tests/attach/test_fleet.py's three synthetic pods (tagged maps with int
hashes and a gap its replay fills, tagged arrays with bytes hashes and a hole, SGLang's field set
with offload placeholders).

Checked: the recorded run's cached hashes (and their copies) equal the independent
subscriber's fold; the prediction equals vLLM's ``cached_tokens`` (96: b0, b1 and the
surviving copy of b2), where a fold without copies predicts 64 (the issue's tiny-pool case);
a second attach started after all this fills the whole history through vLLM's replay and
holds the same cache; the scraped /metrics reached the run; the fidelity monitor's row for
the pod says its stream was complete, in vLLM 0.32's dialect (tagged maps, int hashes).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from engine.attach.fleet import overview
from engine.attach.pod_source import PodSource
from engine.attach.prefix_match import BY_HASH, SHA256, detect_scheme, longest_prefix, stream_chain
from engine.events.folds.hash_cache_state import HashCacheState
from engine.events.schema.hash_key import hash_key
from engine.store.runs import RunStore
from tests.attach.fake_publisher import FakePublisher, free_port
from tests.attach.helpers import source as fake_source, start_attach, wait_until
from tests.attach.test_fleet import ENGINE, caught_up, publish_synthetic, run
from tests.vllm.kv_stream import RawStream, fold_copies
from bench.vllm_servers import BLOCK_SIZE, MODEL_NAME

pytestmark = pytest.mark.vllm

USABLE_BLOCKS = 16
P = [1000 + 7 * i for i in range(72)]  # 2 full blocks and 8 tokens
GEN = 40
POD = "vllm-0"
KV_POD = "kvscope-0"


def _complete(client, prompt: list[int], max_tokens: int):
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    return r.choices[0], r.usage.prompt_tokens_details.cached_tokens


def _held(server, pod: str = POD) -> dict[str, int]:
    view = server.worker.state.to_snapshot().pods[pod]
    return {b.hash: b.copies for b in view.blocks}


def _keys(counter) -> dict[str, int]:
    return {hash_key(h): n for h, n in counter.items()}


def _wait_caught_up(server, stream: RawStream) -> None:
    sub = server.subscriptions[0]
    wait_until(lambda: sub.tracker.next_seq > stream.last_seq and server.items.empty(), timeout=30,
               what=f"attach to receive batch {stream.last_seq}")


def test_attach_records_a_real_vllm_pod_and_predicts_its_hits(vllm_servers, tmp_path):
    from openai import OpenAI

    pod = vllm_servers(num_gpu_blocks_override=USABLE_BLOCKS + 1, replay=True,  # + vLLM's null block
                       extra_args=("--max-model-len", str(USABLE_BLOCKS * BLOCK_SIZE)))
    client = OpenAI(base_url=pod.api_url, api_key="unused", timeout=300)
    source = PodSource(POD, pod.events_endpoint, pod.replay_endpoint, metrics=pod.base_url + "/metrics")
    stream = RawStream(pod.events_endpoint)
    attach = late = kv = None
    pubs = {"syn-map": FakePublisher(), "syn-array": FakePublisher(encoding="array", replay_layout=2),
            "syn-sglang": FakePublisher(replay_layout=2)}
    try:
        from engine import LLM
        from tests.tiny_models import tiny_model_dir

        kv_endpoint, kv_replay = f"ipc://{tmp_path}/kv.sock", f"tcp://127.0.0.1:{free_port()}"
        kv = LLM(model=str(tiny_model_dir("llama")), **ENGINE, kv_events_config={
            "enable_kv_cache_events": True, "endpoint": kv_endpoint, "replay_endpoint": kv_replay})
        attach = start_attach(tmp_path, source, PodSource(KV_POD, kv_endpoint, kv_replay),
                              *(fake_source(p, name) for name, p in pubs.items()), scrape_interval_s=0.5)
        for p in pubs.values():
            p.wait_subscriber()
        publish_synthetic(attach, pubs, {})
        kv_prompt = [100 + i for i in range(13)]  # 3 full blocks of 4 and one token
        assert run(kv, kv_prompt) == 0
        caught_up(attach, kv, KV_POD)
        stream.join(pod, client)  # the reset clears both views: from here they must agree

        r1, _ = _complete(client, P, GEN)
        out1 = list(r1.token_ids)
        _, hit2 = _complete(client, P, GEN)
        assert hit2 == 2 * BLOCK_SIZE
        stream.settle(1.0)
        b2 = stream_chain(P + out1, BLOCK_SIZE)[2]
        assert _keys(fold_copies(stream.events()))[b2] == 2, "vLLM did not keep a second copy of b2"

        fresh = 20_000
        for _ in range(USABLE_BLOCKS + 2):  # one LRU eviction each, until a copy of b2 goes
            _complete(client, list(range(fresh, fresh + BLOCK_SIZE)), 1)
            fresh += BLOCK_SIZE
            stream.settle(0.5)
            removed = [hash_key(h) for e in stream.events() if e["type"] == "BlockRemoved"
                       for h in e["block_hashes"]]
            if b2 in removed:
                break
        assert removed.count(b2) == 1 and _keys(fold_copies(stream.events())).get(b2) == 1, removed

        _wait_caught_up(attach, stream)
        truth = _keys(fold_copies(stream.events()))
        assert _held(attach) == truth  # the live fold, copies and all

        probe = P + out1 + [7] * 20
        view = attach.worker.state.to_snapshot().pods[POD]
        assert detect_scheme(view) == SHA256
        predicted = longest_prefix(view, probe, SHA256)
        no_copies = set()  # the fold before copies were counted: a removal dropped the hash
        for e in stream.events():
            hashes = {hash_key(h) for h in e.get("block_hashes", ())}
            no_copies = (no_copies | hashes if e["type"] == "BlockStored" else no_copies - hashes
                         if e["type"] == "BlockRemoved" else set())
        chain = stream_chain(probe, BLOCK_SIZE)
        old_blocks = next((i for i, h in enumerate(chain) if h not in no_copies), len(chain))
        req = urllib.request.Request(attach.url.replace("ws://", "http://") + "/locate",
                                     data=json.dumps({"token_ids": probe}).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer = json.loads(resp.read())
        by_pod = {p["pod"]: p for p in answer["pods"]}
        assert set(by_pod) == {POD, KV_POD, *pubs}, by_pod.keys()
        for p in answer["pods"]:  # every missed token has one cause, on every pod
            assert p["hit_tokens"] + sum(p["misses"].values()) == answer["prompt_tokens"], p
        located = by_pod[POD]
        kv_probe = json.dumps({"token_ids": kv_prompt[:12] + [5, 6]}).encode()
        req = urllib.request.Request(attach.url.replace("ws://", "http://") + "/locate", data=kv_probe,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            kv_located = {p["pod"]: p for p in json.loads(resp.read())["pods"]}[KV_POD]
        assert kv_located["hit_tokens"] == run(kv, kv_prompt[:12] + [5, 6]) == 12  # the engine's own
        _, served = _complete(client, probe, 1)
        assert (located["method"], located["tier"], located["hit_tokens"]) == ("hash", "GPU", served)
        assert (located["break"]["reason"], located["break"]["block"]) == ("never_stored", 3)
        row = attach.worker.fleet[POD]
        assert (row["completeness"], row["lost_batches"], row["restarts"]) == (1.0, 0, 0)
        assert (row["dialect"]["events"], row["dialect"]["hashes"]) == ("map", "int")
        assert row["duplicate_stores"] >= 1 and row["removed_blocks"] >= 1  # b2's second copy; the LRU walk
        sc = attach.worker.scrapers[POD].latest()  # token against block usage (issue 31 item 6)
        assert sc["num_gpu_blocks"] == USABLE_BLOCKS + 1  # read from vLLM's own cache_config_info
        (ov,) = overview({POD: dict(row, scraped=sc)}, 0.0)
        assert ov["token_usage_high"] == round(sc["kv_cache_usage"] * USABLE_BLOCKS) / USABLE_BLOCKS
        assert 0 <= ov["token_usage_low"] <= ov["token_usage_high"]
        fleet = attach.worker.fleet  # the synthetic pods beside it, each with its own faults
        assert (fleet["syn-map"]["gaps_filled"], fleet["syn-map"]["lost_batches"]) == (1, 0)
        assert (fleet["syn-array"]["gaps_unfilled"], fleet["syn-array"]["lost_batches"]) == (1, 1)
        assert (fleet["syn-sglang"]["placeholder_stores"], fleet["syn-sglang"]["completeness"]) == (3, 1.0)
        assert attach.worker.state.cached("syn-map") == {format(x, "016x") for x in (1, 2, 4, 5)}
        assert predicted.method == BY_HASH
        assert predicted.hit_tokens == served == 3 * BLOCK_SIZE and old_blocks * BLOCK_SIZE == 64
        stream.settle(1.0)

        _wait_caught_up(attach, stream)
        run_id = attach.run_id
        wait_until(lambda: attach.worker.counts, what="a step with pod figures")
        attach.stop()
        records = RunStore(attach.options.db).load_steps(run_id)
        recorded = HashCacheState()
        for r in records:
            recorded.apply_events(r.events)
        truth = _keys(fold_copies(stream.events()))
        assert {b.hash: b.copies for b in recorded.to_snapshot().pods[POD].blocks} == truth
        assert recorded.cached(POD) == set(truth)
        scraped = [r.metrics["scraped"][POD] for r in records if r.metrics.get("scraped", {}).get(POD)]
        assert scraped and "kv_cache_usage" in scraped[-1], scraped[-1:]

        (tmp_path / "late").mkdir()
        late = start_attach(tmp_path / "late", source)  # everything it sees comes through replay
        wait_until(lambda: late.subscriptions[0].tracker.next_seq > stream.last_seq and late.items.empty(),
                   timeout=30, what="the late attach's replay")
        assert late.subscriptions[0].replayed > len(stream.frames)
        assert _held(late) == truth
        print(f"\nattach on vLLM: {len(stream.frames)} batches after the join, {len(truth)} hashes held "
              f"({sum(truth.values())} blocks); probe predicted {predicted.hit_tokens} = served {served} "
              f"(a fold without copies: {old_blocks * BLOCK_SIZE}); late attach replayed "
              f"{late.subscriptions[0].replayed} batches")
    finally:
        stream.close()
        for s in (attach, late):
            if s is not None:
                s.stop()
        for p in pubs.values():
            p.close()
        if kv is not None:
            kv.close()
