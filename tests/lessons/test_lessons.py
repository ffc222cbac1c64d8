"""Every lesson runs end to end on the tiny model, is recorded, and its computed answers
bear out the claim it teaches."""

import json
import subprocess
import sys

import pytest

from engine.store import RunStore
from lessons import LESSONS, get_lesson
from lessons.runner import run_lesson

NUMBERS = [x.number for x in LESSONS]


def answers(doc):
    return {q["key"]: q["answer"] for q in doc["questions"]}


def test_catalog_has_ten_lessons_with_text_and_questions():
    assert NUMBERS == list(range(1, 11))
    for lesson in LESSONS:
        c = lesson.catalog()
        assert c["sections"] and all(s.strip() for s in c["sections"])
        assert 1 <= len(c["questions"]) <= 4 and c["takeaway"]
        json.dumps(c)  # the dashboard reads it as is
    with pytest.raises(ValueError, match="no lesson 11"):
        get_lesson(11)


def test_every_lesson_says_which_vllm_it_models():
    """Each behaviour a lesson models is tagged in its text with the version it follows
    (engine.events.versions), and the catalog lists them for the dashboard."""
    from engine.events.versions import BEHAVIOURS

    for lesson in LESSONS:
        assert lesson.models, f"lesson {lesson.number} names no behaviour it models"
        text = " ".join(" ".join(lesson.sections + (lesson.takeaway,)).split())
        for b in lesson.models:
            assert b in BEHAVIOURS and b.tag() in text, (lesson.number, b.key)
        assert [m["label"] for m in lesson.catalog()["models"]] == [b.label for b in lesson.models]
    six = get_lesson(6)
    assert "[paper / vLLM v0]" in " ".join(six.sections) and "[vLLM v1 (0.x)]" in " ".join(six.sections)
    seven = " ".join(" ".join(get_lesson(7).sections + (get_lesson(7).takeaway,)).split())
    assert "never correctness" not in seven and "batch-shape-dependent" in seven


def test_catalog_imports_no_torch():
    code = "import sys, lessons; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("n", NUMBERS)
def test_lesson_runs_end_to_end_and_is_recorded(n, lesson_doc, lesson_db):
    doc = lesson_doc(n)
    assert doc["elapsed_s"] < 30, "a lesson on the tiny model should take seconds"
    json.dumps(doc)
    for q in doc["questions"]:
        a = q["answer"]
        assert a["explanation"]
        if q["options"]:
            assert a["option"] in q["options"]
    assert doc["charts"] and all(c["kind"] in ("bars", "lines", "table") for c in doc["charts"])
    assert doc["recorded"]
    store = RunStore(lesson_db)
    for r in doc["runs"]:
        run = store.get_run(r["run_id"])
        assert run["label"].startswith(f"lesson {n}: ")
        for k in ("num_blocks", "block_size", "max_model_len", "max_num_batched_tokens"):
            assert run["config"][k] == r["config"].get(k, run["config"][k])
    pool = doc["pool"]
    assert store.snapshot_at(pool["run_id"], pool["step"]).to_dict() == pool["snapshot"]  # replayable
    assert "pool at step" in pool["text"]


def test_l1_paged_fits_more_and_wastes_less_than_contiguous(lesson_doc):
    a = answers(lesson_doc(1))
    conc, waste = a["concurrency"]["value"], a["waste"]["value"]
    assert conc["paged"] > conc["prompt_plus_max_tokens"] > conc["max_model_len"] == 2
    assert waste["paged"] < waste["prompt_plus_max_tokens"] < waste["max_model_len"]
    assert a["concurrency"]["option"] == "paged runs more at once"
    assert a["external"]["value"]["steps_blocked"] > 0 and a["external"]["option"] == "yes"


def test_l2_table_grows_a_block_at_a_time_anywhere_in_the_pool(lesson_doc):
    a = answers(lesson_doc(2))
    assert a["after_prefill"]["value"] == 2  # ceil(13 / 8)
    assert a["third_block"]["value"] == 17  # the 17th token is the first of block 2
    assert a["contiguous"]["option"] == "no, scattered"


def test_l3_bigger_blocks_waste_more_and_hit_less(lesson_doc):
    a = answers(lesson_doc(3))
    frag = [a["waste"]["value"][s] for s in ("8", "16", "32", "64")]
    hits = [a["hits"]["value"][s] for s in ("8", "16", "32", "64")]
    assert frag == sorted(frag) and frag[0] < frag[-1]
    assert hits == sorted(hits, reverse=True) and hits[0] > hits[1] and hits[-1] == 0
    assert a["waste"]["option"] == "64" and a["hits"]["option"] == "8"


def test_l4_chunking_lowers_short_requests_ttft(lesson_doc, tiny_llama):
    doc = lesson_doc(4)
    a = answers(doc)
    steps = doc["facts"]["short_first_token_step"]
    assert steps["chunked"] < steps["no_chunking"]  # the deterministic half of the claim
    assert a["long_steps"]["value"] == 16  # ceil(250 / 16)
    # the cap, not chunking, is what spreads the long prefill: 4 steps of the 64-token
    # budget without it, 16 steps of 16 tokens (plus the short decodes) with it
    f = doc["facts"]
    assert f["long_prefill_steps_no_cap"] == 4 and f["long_first_token_step"] == {
        "no_chunking": 1, "chunked_no_cap": 4, "chunked": 16}
    assert f["mean_tokens_per_long_prefill_step"]["chunked_no_cap"] == 64
    assert 16 <= f["mean_tokens_per_long_prefill_step"]["chunked"] < 20  # "19 of 64"
    # chunking alone does not help the short requests: the running long prompt is served first
    assert steps["chunked_no_cap"] > steps["no_chunking"] > steps["chunked"]
    # TTFT is wall time: on a shared CPU one descheduled step can swamp the tiny model's
    # millisecond steps, so a fresh run gets two more tries before the claim fails.
    for attempt in range(3):
        v, c = a["short_ttft"]["value"], a["cause"]["value"]
        if v["chunked_s"] < v["no_chunking_s"] and c["cap_s"] > c["chunking_s"]:
            break
        a = answers(run_lesson(get_lesson(4), tiny_llama, record=False))
    assert v["chunked_s"] < v["no_chunking_s"]
    assert c["cap_s"] > c["chunking_s"] and a["cause"]["option"] == "the 16-token per-request cap"


def test_l5_sub_block_prefix_gets_zero_hits_for_a_partial_reason(lesson_doc):
    doc = lesson_doc(5)
    a = answers(doc)
    assert a["hit_tokens"]["value"] == 32  # floor(40 / 16) blocks
    assert a["sub_block"]["value"] == 0
    assert a["why"]["value"]["partial"] > 0 and a["why"]["option"].startswith("partial")
    rates = [float(r.rstrip("%")) for r in doc["facts"]["hit_rate_by_block_size"].values()]
    assert rates == sorted(rates, reverse=True) and rates[-1] == 0


def test_l6_forks_use_fewer_blocks_and_copy_on_write(lesson_doc):
    a = answers(lesson_doc(6))
    peak = a["peak"]["value"]
    assert peak["fork"] < peak["separate"] and a["peak"]["option"] == "the forks use fewer"
    assert a["copies"]["value"] == 3  # one per extra sample, for the shared partial block
    assert a["still_shared"]["value"] == 2  # the full prompt blocks


def test_l6_vllm_v1_children_share_full_blocks_by_hits_and_own_their_partial_blocks(lesson_doc):
    doc = lesson_doc(6)
    a, share = answers(doc), doc["facts"]["sharing"]
    fork, v1 = share["n=4 forks"], share["n=4 as child requests"]
    # 2 full blocks shared by hits + 4 partial blocks, against the forks' 3 shared blocks
    assert a["v1_after_prompt"]["value"] == v1["blocks_after_prompt_step"] == 6
    assert fork["blocks_after_prompt_step"] == 3
    assert (v1["cow_copies"], v1["prefix_hit_tokens"]) == (0, 3 * 32)
    assert (fork["cow_copies"], fork["prefix_hit_tokens"]) == (3, 0)
    assert v1["prompt_tokens_computed"] == 45 + 3 * 13 and fork["prompt_tokens_computed"] == 45
    assert v1["shared_by_all"] == fork["shared_by_all"] == [0, 1]
    assert v1["peak_blocks"] == fork["peak_blocks"] == 10  # the copies catch up in one step
    assert doc["facts"]["v1_same_tokens_as_forks"]  # same seeds, same samples


def test_l7_preemption_keeps_greedy_output_and_evicts_tails_first(lesson_doc):
    a = answers(lesson_doc(7))
    same = a["same_output"]["value"]
    assert same["preemptions"] > 0 and same["identical"]
    assert a["same_output"]["option"] == "yes, token for token"
    ev = a["evict_first"]["value"]
    assert ev["logical_index"] == 2 and ev["eviction_order_logical"][0] == 2
    assert a["victim"]["option"] == "the one that arrived last"
    assert "On a GPU" in a["same_output"]["explanation"]


def test_l8_budget_arithmetic_and_the_too_small_error(lesson_doc):
    doc = lesson_doc(8)
    a, f = answers(doc), doc["facts"]
    assert a["num_blocks"]["value"] == f["budget_bytes"] // f["kv_bytes_per_block"] == 10
    assert a["sequences"]["value"] == 10 // 4
    assert "KVCacheTooSmallError" in a["too_small"]["value"]["error"]
    assert a["too_small"]["option"].startswith("the engine refuses")


def test_l9_prefix_routing_keeps_tenants_together_and_hits_more(lesson_doc):
    """Each request's hits are the real engine's; the routers are kvscope simulate's."""
    from lessons.l09_prefix_routing import PER_TENANT, SYSTEM_LEN, TENANTS

    doc = lesson_doc(9)
    a, facts = answers(doc), doc["facts"]
    spread = facts["pods_per_tenant"]
    assert all(n == 1 for n in spread["precise-prefix"].values())  # a tenant stays on its pod
    assert max(spread["round-robin"].values()) > 1
    # every request after a tenant's first reuses exactly its system prompt's blocks
    assert a["prefix_aware"]["value"] == (PER_TENANT - 1) * len(TENANTS) * SYSTEM_LEN
    assert a["round_robin"]["value"] < a["prefix_aware"]["value"]
    assert a["round_robin"]["value"] % SYSTEM_LEN == 0  # a hit is a whole system prompt or none
    rows = next(c for c in doc["charts"] if c["kind"] == "table")["rows"]
    assert sum(r[3] for r in rows) == a["round_robin"]["value"] and len(rows) == PER_TENANT * len(TENANTS)
    fleet = a["fleet"]["value"]
    assert fleet["precise-prefix"] > fleet["round-robin"] and a["fleet"]["option"] in ("precise-prefix", "oracle")


def test_l10_misses_have_their_causes_and_token_usage_is_the_folded_fill(lesson_doc):
    """vLLM #54607's 0% is the block floor; a turn reuses whole blocks of prompt and answer;
    pressure evicts; the pool reads 100% blocks while 53% of its slots hold a token
    (vLLM #57336's gap), the engine's figure equals the fold of its events at every step
    and lies in the bound an attached viewer's stored blocks allow."""
    from lessons.l10_cache_misses import BLOCK_SIZE, OCC_POOL, SYSTEM_LEN

    doc = lesson_doc(10)
    a, f = answers(doc), doc["facts"]
    assert a["bug"]["value"]["hit_tokens_by_prefix"] == {"15": 0, "16": 16, "31": 16, "32": 32}
    assert all(len(set(v)) == 1 for v in f["hit_tokens_of_each_later_request"].values())
    # 3 later requests x (15 + 12 tokens), all in the block the question shares
    assert a["bug"]["value"]["miss_causes_15"] == {"cold": 0, "evicted": 0, "partial": 81, "disabled": 0}
    assert a["bug"]["option"] == "no: the shared prefix is shorter than a block"
    # turn 1 computed 40 + 10 - 1 = 49 tokens: 3 full blocks; turn 2 is 62 tokens
    assert a["turn2"]["value"] == 48 and f["turn1_answer_same_in_both_runs"]
    ev = a["evicted"]["value"]
    assert (ev["hits_tight"], ev["hits_roomy"]) == (0, SYSTEM_LEN)
    assert ev["miss_causes_tight"] == {"cold": 0, "evicted": SYSTEM_LEN, "partial": 8, "disabled": 0}
    assert a["evicted"]["option"].startswith("evicted")
    assert ev["peak_blocks_tight"] == 12 and ev["evictions_tight"] >= 2  # A's two system blocks at least
    occ = f["occupancy"]
    # step 1: 16 requests of 17 tokens hold 2 blocks each; 8 of 62 tokens hold 4 each
    assert occ["17"] == {"step": 1, "kv_cache_usage": 1.0, "kv_token_usage": 16 * 17 / (OCC_POOL * BLOCK_SIZE),
                         "filled_slots": 272, "used_blocks": 32, "stored_blocks": 16,
                         "bound_low": 0.5, "bound_high": 1.0}
    assert occ["62"]["kv_token_usage"] == 8 * 62 / (OCC_POOL * BLOCK_SIZE) and occ["62"]["bound_low"] == 0.75
    assert f["fold_matches_engine"] and f["bound_holds_every_step"]
    assert a["fill"]["option"] == "between 50% and 90%"
    assert doc["pool"]["step"] == 1 and "[1/16]" in doc["pool"]["text"]
