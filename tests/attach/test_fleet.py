"""The fleet microscope on five pods at once: two kvscope engines (the tiny Llama, in process,
publishing through engine.kv_events) and three synthetic publishers in other dialects (tagged
maps and arrays, int and bytes hashes, 3- and 2-frame replay, SGLang's field set with offload
placeholders), with gaps, a hole, a restart, duplicates and placeholders injected.

``POST /locate`` must say, per pod, exactly what the engine then serves: for each kvscope pod
its ``hit_tokens`` equals the engine's own ``num_cached_tokens`` for that prompt, and the
break's reason is the one the workload made (evicted, diverged, never stored, partial block)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import LLM, SamplingParams
from engine.attach.fleet import overview
from engine.attach.pod_source import PodSource
from engine.events.schema.hash_key import hash_key
from engine.kv_events.mapping import vllm_block_hash
from engine.simulate.routers import ROUTERS
from tests.attach.fake_publisher import FakePublisher, free_port, removed, stored
from tests.attach.helpers import source, start_attach, wait_until

BS = 4
ENGINE = dict(block_size=BS, num_kv_blocks=20, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4)
SYSTEM = list(range(100, 113))  # 13 tokens: 3 full blocks and one
GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
KV = ("kv-0", "kv-1")


def http(url: str, body: bytes | None = None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def locate(srv, **body) -> dict[str, dict]:
    status, out = http(srv.url.replace("ws://", "http://") + "/locate", json.dumps(body).encode())
    assert status == 200, out
    for p in out["pods"]:  # the miss explainer: every prompt token that misses has one cause
        assert p["hit_tokens"] + sum(p["misses"].values()) == out["prompt_tokens"], p
    return {p["pod"]: p for p in out["pods"]}


def run(llm: LLM, prompt: list[int]) -> int:
    """Serve one prompt to the end; the engine's own num_cached_tokens for it."""
    eng = llm.engine
    rid = eng.add_request(prompt, GREEDY)
    cached = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.request_id == rid and out.finished:
                cached = out.num_cached_tokens
    assert llm.engine.kv_events.flush()
    return cached


def engine_cached(llm: LLM) -> set[str]:
    return {hash_key(vllm_block_hash(h)) for h in llm.engine.engine_core.scheduler.kv.pool.cached}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from tests.tiny_models import tiny_model_dir

    tmp = tmp_path_factory.mktemp("fleet")
    model = str(tiny_model_dir("llama"))
    llms, pubs, srv = {}, {}, None
    try:
        sources = []
        for i, name in enumerate(KV):
            endpoint, replay = f"ipc://{tmp}/kv{i}.sock", f"tcp://127.0.0.1:{free_port()}"
            llms[name] = LLM(model=model, **ENGINE, kv_events_config={
                "enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": replay})
            sources.append(PodSource(name, endpoint, replay))
        pubs["syn-map"] = FakePublisher()  # current vLLM: maps, int hashes, 3-frame replay
        pubs["syn-array"] = FakePublisher(encoding="array", replay_layout=2)  # vLLM <= 0.23
        pubs["syn-sglang"] = FakePublisher(replay_layout=2)  # SGLang: maps, 2-frame replay
        sources += [source(p, name) for name, p in pubs.items()]
        srv = start_attach(tmp, *sources, label="fleet")
        for p in pubs.values():
            p.wait_subscriber()
        yield srv, llms, pubs, {}
    finally:
        if srv is not None:
            srv.stop()
        for llm in llms.values():
            llm.close()
        for p in pubs.values():
            p.close()


def caught_up(srv, llm: LLM, name: str) -> None:
    want = engine_cached(llm)
    wait_until(lambda: srv.worker.state.cached(name) == want, timeout=30, what=f"{name}'s cache")



def publish_synthetic(srv, pubs: dict[str, FakePublisher], done: dict) -> None:
    """The synthetic pods' workload, once per module (the tests share the fleet)."""
    if done.get("synthetic"):
        return
    done["synthetic"] = True
    t = list(range(1, 13))
    m = pubs["syn-map"]
    m.publish([stored([1, 2, 3], None, t, BS)])
    m.publish([stored([4], 2, [9, 9, 5, 5], BS)])  # a branch after block 1 (tokens 8.. differ at 10)
    m.publish([removed([3])], drop_live=True)  # lost live, filled by replay
    m.publish([stored([5], None, [50, 51, 52, 53], BS)])
    a = pubs["syn-array"]
    b = [bytes([i]) * 32 for i in range(8)]
    a.publish([stored(b[0:3], None, t, BS)])
    a.publish([stored(b[0:3], None, t, BS)])  # stored again: duplicate stores (recomputed copies)
    a.publish([removed([b[1]])], drop_live=True, drop_replay=True)  # a hole: the removal is lost
    a.publish([stored([b[4]], None, [60, 61, 62, 63], BS)])
    s = pubs["syn-sglang"]
    s.publish([stored([21, 22, 23], None, t, BS, cache_salt=None)])
    s.publish([stored([21, 22, 23], None, [], 0, medium="CPU_PINNED")])  # offloaded: placeholders
    s.publish([removed([23, 22])])  # the GPU copies of blocks 1 and 2 go
    wait_until(lambda: len(getattr(srv.worker.state.pods.get("syn-sglang"), "blocks", ())) == 4
               and srv.worker.state.cached("syn-map") == {format(x, "016x") for x in (1, 2, 4, 5)}
               and len(srv.worker.state.cached("syn-array")) == 4, what="the synthetic pods")


def test_locate_answers_what_each_pod_then_serves(fleet):
    srv, llms, pubs, done = fleet
    kv0, kv1 = llms["kv-0"], llms["kv-1"]
    # kv-0 serves the system prompt with questions; kv-1 a stream that evicts the first one
    for q in ([7, 8, 9, 10, 11], [7, 8, 20, 21, 22], [30, 31]):
        run(kv0, SYSTEM + q)
    first = list(range(10, 32))  # 22 tokens: 5 full blocks
    assert run(kv1, first) == 0
    for i in range(4):  # 4 x 6 blocks through a 20-block pool: the first prompt's blocks go
        run(kv1, [130 + 38 * i + k for k in range(22)])
    publish_synthetic(srv, pubs, done)
    for name, llm in llms.items():
        caught_up(srv, llm, name)

    # 1. the system prompt and a new question: kv-0 holds 3 blocks, where it diverges
    probe = SYSTEM + [7, 8, 40, 41, 42, 43]  # 19 tokens: 4 full blocks
    got = locate(srv, token_ids=probe)
    assert list(got) == ["kv-0", "kv-1", "syn-map", "syn-array", "syn-sglang"]
    a = got["kv-0"]
    assert a["scheme"] == "sha256" and a["method"] == "hash" and a["tier"] == "GPU"
    assert (a["cached_blocks"], a["cached_tokens"]) == (3, 12)
    assert (a["break"]["reason"], a["break"]["block"], a["break"]["token"]) == ("diverged", 3, 15)
    b = got["kv-1"]
    assert (b["cached_blocks"], b["break"]["reason"], b["break"]["token"]) == (0, "diverged", 0)
    assert a["misses"] == {"diverged": 4, "partial_block": 3}  # block 3 differs at token 15; 3 left over
    assert run(kv0, probe) == a["hit_tokens"] == 12
    assert run(kv1, probe) == b["hit_tokens"] == 0
    caught_up(srv, kv0, "kv-0")
    caught_up(srv, kv1, "kv-1")

    # 2. kv-1's first prompt: its chain was evicted, and the locator says when
    got = locate(srv, token_ids=first)
    b = got["kv-1"]
    assert b["cached_blocks"] < 5 and b["break"]["reason"] == "evicted"
    assert b["break"]["ts"] is not None and b["break"]["step"] is not None and b["break"]["block"] == b["cached_blocks"]
    assert (got["kv-0"]["break"]["reason"], got["kv-0"]["break"]["token"]) == ("diverged", 0)
    assert run(kv1, first) == b["hit_tokens"]
    caught_up(srv, kv1, "kv-1")

    # 3. whole blocks and a prompt shorter than a block, on both engines
    for probe in (SYSTEM[:12], SYSTEM[:3]):
        got = locate(srv, token_ids=probe)
        for name, llm in llms.items():
            assert run(llm, probe) == got[name]["hit_tokens"], (name, probe)
            caught_up(srv, llm, name)
        assert got["kv-0"]["break"]["reason"] == ("whole_prompt" if len(probe) == 12 else "below_block")
    assert got["kv-0"]["hit_tokens"] == 0

    # 4. the synthetic pods, exactly
    t = list(range(1, 13)) + [99]
    got = locate(srv, token_ids=t)
    m = got["syn-map"]
    assert (m["method"], m["cached_blocks"], m["break"]["reason"], m["break"]["block"]) == ("token ids", 2, "evicted", 2)
    arr = got["syn-array"]  # the hole hid block 1's removal: the index says 3 blocks (and is incomplete)
    assert (arr["cached_blocks"], arr["break"]["reason"], arr["incomplete"]) == (3, "partial_block", True)
    sg = got["syn-sglang"]  # GPU lost blocks 1 and 2; the CPU_PINNED tier still holds all three
    assert (sg["tier"], sg["cached_blocks"], sg["hit_tokens"]) == ("CPU_PINNED", 3, 12)
    gpu = next(x for x in sg["tiers"] if x["tier"] == "GPU")
    assert (gpu["cached_blocks"], gpu["break"]["reason"], gpu["break"]["block"]) == (1, "evicted", 1)
    got = locate(srv, token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 7, 7, 1])
    assert (got["syn-map"]["cached_blocks"], got["syn-map"]["break"]["reason"],
            got["syn-map"]["break"]["token"]) == (2, "diverged", 10)


@pytest.mark.parametrize("body, says", [
    (b"", "the body is empty"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"prompt": "hello"}', "needs a tokenizer: start kvscope attach with --tokenizer"),
    (b'{"prompt": "a", "token_ids": [1]}', "exactly one of prompt"),
    (b'{"token_ids": []}', "empty"),
    (b'{"token_ids": [1, "x"]}', "token_ids[1]"),
    (b'{"token_ids": [1], "max_tokens": 3}', "unknown field(s) 'max_tokens'"),
])
def test_locate_refuses_bad_input_by_name(fleet, body, says):
    srv = fleet[0]
    status, out = http(srv.url.replace("ws://", "http://") + "/locate", body)
    assert status == 400 and says in out["detail"], out
    status, out = http(srv.url.replace("ws://", "http://") + "/locate", method="GET")
    assert status == 405


def test_fidelity_counts_what_each_pod_did_on_the_wire(fleet):
    srv, llms, pubs, done = fleet
    publish_synthetic(srv, pubs, done)
    m, a = pubs["syn-map"], pubs["syn-array"]
    # syn-map: a duplicate batch (seq 3 again), a bad message, an undecodable batch, one more
    last = m.buffer[-1]
    m.send_raw([m.topic, last[0].to_bytes(8, "big"), last[1]])
    m.send_raw([b"not", b"a batch"])
    m.publish([], payload=b"\xc1")  # 0xc1: a byte msgpack never uses
    m.publish([stored([6], 5, [54, 55, 56, 57], BS)])
    # syn-array: the publisher restarts (seq back to 0, its cache empty)
    a.restart()
    a.wait_subscriber()
    a.publish([stored([bytes([9]) * 32], None, [70, 71, 72, 73], BS)])
    wait_until(lambda: srv.worker.fleet.get("syn-map", {}).get("received") == 5
               and srv.worker.fleet.get("syn-array", {}).get("restarts") == 1, what="the injected faults")
    wait_until(lambda: all(srv.worker.fleet.get(p, {}).get("received", 0) >= 3 for p in srv.worker.fleet)
               and len(srv.worker.fleet) == 5, what="every pod's row")
    f = dict(srv.worker.fleet)
    sm = f["syn-map"]
    assert {k: sm[k] for k in ("received", "live", "replayed_gap", "gaps", "gaps_filled", "gaps_unfilled",
                               "holes", "lost_batches", "undecodable", "duplicate_batches", "bad_messages",
                               "restarts")} == {
        "received": 5, "live": 4, "replayed_gap": 1, "gaps": 1, "gaps_filled": 1, "gaps_unfilled": 0,
        "holes": 1, "lost_batches": 1, "undecodable": 1, "duplicate_batches": 1, "bad_messages": 1, "restarts": 0}
    assert sm["completeness"] == 5 / 6
    assert sm["dialects"] == {"events map · hashes int · 3 frames · fields common": 5,
                              "undecodable · 3 frames": 1}
    sa = f["syn-array"]
    assert {k: sa[k] for k in ("received", "gaps", "gaps_unfilled", "lost_batches", "restarts",
                               "duplicate_stores", "cached_blocks")} == {
        "received": 4, "gaps": 1, "gaps_unfilled": 1, "lost_batches": 1, "restarts": 1,
        "duplicate_stores": 3, "cached_blocks": 1}  # the restart emptied the cache
    assert sa["completeness"] == 4 / 5
    assert set(sa["dialects"]) == {"events array · hashes bytes · 3 frames · fields vllm-0.3x"}
    sg = f["syn-sglang"]
    assert (sg["placeholder_stores"], sg["completeness"], sg["evicted_blocks"]) == (3, 1.0, 2)
    assert sg["dialects"] == {"events map · hashes int · 3 frames · fields sglang": 2,
                              "events map · hashes int · 3 frames · fields common": 1}
    for name in KV:
        k = f[name]
        assert (k["completeness"], k["lost_batches"], k["restarts"], k["bad_messages"]) == (1.0, 0, 0, 0)
        assert k["dialect"]["events"] == "map" and k["dialect"]["hashes"] == "int"
    # reachable against achieved: kv-1 recomputed the system prompt blocks kv-0 held
    kv1 = f["kv-1"]
    assert kv1["placed_chains"] >= 3 and kv1["reachable_blocks"] - kv1["achieved_blocks"] >= 3
    assert all(f[p]["reachable_blocks"] >= f[p]["achieved_blocks"] for p in f)
    # the fleet page's rows: what to look at, per pod
    ov = {r["pod"]: r for r in overview({p: f[p] for p in f}, time.time())}
    assert list(ov) == [*KV, "syn-map", "syn-array", "syn-sglang"]
    assert ov["syn-array"]["alerts"] == ["1 batch(es) lost in 1 hole(s)", "publisher restarted 1x"]
    assert ov["syn-map"]["alerts"] == ["1 batch(es) lost in 1 hole(s)"]
    assert ov["syn-sglang"]["alerts"] == [] and ov["syn-sglang"]["evicted_blocks"] == 2
    for name in KV:
        assert ov[name]["alerts"] == [] and ov[name]["last_event_age_s"] < 60
    # attach's own /metrics carry the same, per pod (so the fleet view lands in Grafana)
    locate(srv, token_ids=[1, 2, 3, 4, 5])
    with urllib.request.urlopen(srv.url.replace("ws://", "http://") + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {(s.name, s.labels.get("pod")): s for fam in text_string_to_metric_families(text)
               for s in fam.samples}
    assert samples[("kvscope_attach_restarts_total", "syn-array")].value == 1
    assert samples[("kvscope_attach_lost_batches_total", "syn-map")].value == 1
    assert samples[("kvscope_attach_duplicate_batches_total", "syn-map")].value == 1
    assert samples[("kvscope_attach_gaps_filled_total", "syn-map")].value == 1
    assert samples[("kvscope_attach_placeholder_stores_total", "syn-sglang")].value == 3
    assert samples[("kvscope_attach_evicted_blocks_total", "syn-sglang")].value == 2
    assert samples[("kvscope_attach_completeness_ratio", "syn-map")].value == pytest.approx(5 / 6)
    assert samples[("kvscope_attach_completeness_ratio", "kv-0")].value == 1.0
    assert samples[("kvscope_attach_locate_queries_total", "kv-1")].value >= 1
    assert samples[("kvscope_attach_evicted_blocks_total", "kv-1")].value == f["kv-1"]["evicted_blocks"]
    assert samples[("kvscope_attach_dialect_info", "syn-array")].labels == {
        "pod": "syn-array", "events": "array", "hashes": "bytes", "frames": "3", "fields": "vllm-0.3x"}
    assert 0 <= samples[("kvscope_attach_last_batch_age_seconds", "kv-0")].value < 60
    # the wire doctor: the latest raw batches, newest first, field by field
    status, got = http(srv.url.replace("ws://", "http://") + "/wire?pod=syn-map", method="GET")
    assert status == 200
    newest, bad = got["batches"][0], got["batches"][1]
    assert newest["seq"] == 5 and newest["dialect"]["events"] == "map"
    fields = {r["path"]: r["value"] for r in newest["fields"]}
    assert fields["events[0].type"] == "BlockStored" and fields["events[0].parent_block_hash"] == "5"
    assert fields["events[0].token_ids"] == "4 × int: 54, 55, 56, 57"
    assert bad["seq"] == 4 and "not msgpack" in bad["dialect"]["error"]
    status, got = http(srv.url.replace("ws://", "http://") + "/wire?pod=syn-array", method="GET")
    arr = {r["path"]: r for r in got["batches"][0]["fields"]}
    assert arr["events[0]"]["value"].startswith("tagged array of") and arr["events[0].medium"]["value"] == "GPU"
    status, got = http(srv.url.replace("ws://", "http://") + "/wire?pod=nope", method="GET")
    assert status == 404 and "'syn-map'" in got["detail"]


def test_routing_policies_and_the_miss_explainer_on_the_fleet(fleet):
    srv, llms, pubs, done = fleet
    publish_synthetic(srv, pubs, done)
    base = srv.url.replace("ws://", "http://")
    wait_until(lambda: srv.worker.policy_summary.get("requests", 0) >= 1, what="a policy summary")
    status, got = http(base + "/routers", method="GET")
    assert status == 200
    # every policy of kvscope simulate, over the same requests as achieved and reachable
    assert list(got["policies"]) == ["round-robin", "least-loaded", "precise-prefix", "approx-prefix",
                                     "dynamo", "oracle"]
    f = dict(srv.worker.fleet)
    gpu = {p: f[p] for p in f if p != "syn-sglang"}  # its chains: GPU then CPU_PINNED placeholders
    assert got["requests"] >= 3 and got["blocks"] >= got["reachable_blocks"] >= got["achieved_blocks"]
    for name, pol in got["policies"].items():
        assert 0 <= pol["hit_blocks"] <= got["blocks"], name
        assert pol["models"] == ROUTERS[name].models  # what real router it models
        assert sum(pol["requests_per_pod"].values()) == got["requests"]
        assert list(pol["requests_per_pod"]) == [*KV, "syn-map", "syn-array", "syn-sglang"]
    rr = got["policies"]["round-robin"]["requests_per_pod"]
    assert max(rr.values()) - min(rr.values()) <= 1  # in turn
    series = got["series"]
    assert series and series[-1]["requests"] == got["requests"]
    assert [p["requests"] for p in series] == sorted(p["requests"] for p in series)
    assert got["achieved_blocks"] <= sum(r["achieved_blocks"] for r in gpu.values()) + f["syn-sglang"]["achieved_blocks"]
    # the miss explainer: per pod, the causes of the requests seen add up to their missed blocks
    for pod, r in f.items():
        bs = r["block_size"] or 0
        assert sum(r["miss_tokens"].values()) == r["missed_tokens"] \
            == (r["placed_blocks"] - r["achieved_blocks"]) * bs, pod
    assert f["kv-1"]["miss_tokens"].get("never_stored", 0) >= 1  # its first prompt: cold
    # and the locator's probes, per pod: they add up to the prompts less the hits
    assert all(sum(r["probe_misses"].values()) == r["probe_prompt_tokens"] - r["probe_hit_tokens"]
               for r in f.values())
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    hits = {s.labels["policy"]: s.value for s in samples if s.name == "kvscope_attach_policy_hit_blocks_total"}
    assert set(hits) == set(got["policies"])
    (blocks,) = [s.value for s in samples if s.name == "kvscope_attach_policy_blocks_total"]
    assert blocks >= got["requests"]
    miss = {(s.labels["pod"], s.labels["cause"]): s.value for s in samples
            if s.name == "kvscope_attach_miss_tokens_total" and s.labels["source"] == "events"}
    assert miss[("kv-1", "never_stored")] >= 1
