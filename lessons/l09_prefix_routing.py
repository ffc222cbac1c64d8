"""Lesson 9: routing by prefix — four pods, round-robin against a prefix-aware router.

The routers are ``kvscope simulate``'s (engine/simulate/routers): they pick each request's
pod on the simulator's virtual clock, from what their real counterparts would see. Then
every pod's share of the requests runs on the real engine, one engine per pod, and the hits
are the engine's own. The fleet-scale part is the simulator alone, on the shipped trace.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine.core import CacheConfig, SchedulerConfig
from engine.events.versions import FULL_BLOCK_HASHING, HIT_CAP, PREFIX_ROUTING
from engine.simulate.cost import default_cost
from engine.simulate.report import summarize
from engine.simulate.simulation import SimConfig, simulate
from engine.simulate.trace import Trace, TracedRequest, read_mooncake

from lessons.base import Answer, Lesson, LessonResult, Question, bars, pct, table
from lessons.scenario import Req, greedy

PODS, BLOCK_SIZE, SYSTEM_LEN, QUESTION_LEN, PER_TENANT, OUT = 4, 16, 48, 8, 4, 4
TENANTS = ("You are a ship's navigator. Answer briefly. ", "You are a pastry chef. Be exact. ",
           "You are a chess coach. Explain one idea. ", "You are a beekeeper. Keep it short. ")
ROUTERS = ("round-robin", "precise-prefix")
FLEET_ROUTERS = ("round-robin", "least-loaded", "precise-prefix", "oracle")
FLEET_TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "mooncake_conversation_300.jsonl"
FLEET_REQUESTS, FLEET_BLOCKS = 60, 1100  # the first 60 requests; 1,100 blocks of 16 per pod
EVERY_S = 0.3  # arrivals on the simulator's clock: a request takes about 0.5 s there
GAP = 8  # driver steps between a pod's requests: each finishes (1 prefill + 3 decode steps) first

SECTIONS = (
    """**One pod's cache is not the fleet's.** A prefix cache lives inside one engine. Put
four engines behind a load balancer and a request hits only if it lands on a pod that
already holds its prefix. Most load balancers never look: round-robin sends request k to
pod k mod 4, whatever it starts with.""",
    f"""**Prefix-aware routing.** Each pod publishes its KV cache events (which block hashes
it stored and removed). A router that follows them knows, for every pod, which chains of
blocks it holds. A new request's prompt is hashed block by block {FULL_BLOCK_HASHING.tag()};
each pod scores the longest run of those hashes, from the first, that it holds, and the
request goes to the best pod, ties to the least loaded {PREFIX_ROUTING.tag()}. A hit still
never covers the last prompt token {HIT_CAP.tag()}.""",
    f"""**The scenario.** Four tenants, each with its own {SYSTEM_LEN}-token system prompt
(three blocks of {BLOCK_SIZE}), send {PER_TENANT} questions each, {PODS * PER_TENANT} requests
in a shuffled order, one every {EVERY_S} s. `kvscope simulate`'s two routers, round-robin and
llm-d's precise prefix scorer, pick the pods; then each pod's requests run on the real
engine, one engine per pod, and the hits are counted by the engine. Last, the same routers
(and least-loaded, and an oracle that knows every cache) on the first {FLEET_REQUESTS}
requests of the shipped Mooncake-format conversation trace, at fleet scale: the simulator
alone, its hit rates are the same core's.""",
)


def _workload(ctx) -> list[TracedRequest]:
    systems = [ctx.prompt(text, SYSTEM_LEN) for text in TENANTS]
    order = [(t, q) for t in range(len(TENANTS)) for q in range(PER_TENANT)]
    random.Random(9).shuffle(order)
    reqs = []
    for i, (t, q) in enumerate(order):
        question = ctx.prompt(f"Question {q + 1} of tenant {t + 1}: what matters most here? ", QUESTION_LEN + q)
        reqs.append(TracedRequest(f"t{t}q{q}", i * EVERY_S, tuple(systems[t] + question), OUT))
    return reqs


def _route(reqs: list[TracedRequest], router: str) -> list[int]:
    """Each request's pod, as ``router`` picks it on the simulator's clock."""
    cfg = SimConfig(PODS, router, SchedulerConfig(max_model_len=256),
                    CacheConfig(block_size=BLOCK_SIZE, num_blocks=64), default_cost())
    return [t.pod for t in simulate(Trace(tuple(reqs), "lesson 9", {}), cfg).requests]


def _fleet() -> dict[str, dict]:
    full = read_mooncake(FLEET_TRACE)
    trace = Trace(full.requests[:FLEET_REQUESTS], full.source, {})
    longest = max(r.num_prompt_tokens + r.output_length for r in trace.requests)
    out = {}
    for router in FLEET_ROUTERS:
        cfg = SimConfig(PODS, router, SchedulerConfig(max_model_len=longest, max_num_batched_tokens=8192),
                        CacheConfig(block_size=BLOCK_SIZE, num_blocks=FLEET_BLOCKS), default_cost())
        out[router] = summarize(simulate(trace, cfg))
    return out


def run(ctx) -> LessonResult:
    reqs = _workload(ctx)
    hits: dict[str, dict[str, int]] = {}
    placed: dict[str, list[int]] = {}
    focus = None
    for router in ROUTERS:
        pods = placed[router] = _route(reqs, router)
        hits[router] = {}
        for k in range(PODS):
            mine = [r for r, p in zip(reqs, pods) if p == k]
            if not mine:
                continue
            work = [Req(r.request_id, r.tokens(), greedy(OUT), GAP * j) for j, r in enumerate(mine)]
            t = ctx.run(f"{router}, pod {k}", work, block_size=BLOCK_SIZE, num_kv_blocks=64,
                        max_model_len=256)
            hits[router].update({rid: lk.num_hit_tokens for rid, lk in t.lookups().items()})
            if router == "precise-prefix" and focus is None and len(mine) > 1:
                focus = (t, t.first_token_step(mine[1].request_id))
    total = {r: sum(hits[r].values()) for r in ROUTERS}
    prompt_tokens = sum(r.num_prompt_tokens for r in reqs)
    spread = {r: {t: len({p for q, p in zip(reqs, placed[r]) if q.request_id.startswith(f"t{t}q")})
                  for t in range(len(TENANTS))} for r in ROUTERS}
    fleet = _fleet()
    rate = {r: fleet[r]["achieved_hit_rate"] or 0.0 for r in FLEET_ROUTERS}
    reach = {r: fleet[r]["reachable_hit_rate"] or 0.0 for r in FLEET_ROUTERS}
    best = max(FLEET_ROUTERS, key=lambda r: rate[r])
    rr, pp = ROUTERS
    answers = {
        "round_robin": Answer(
            total[rr],
            explanation=f"Round-robin spread each tenant over {', '.join(str(spread[rr][t]) for t in spread[rr])} "
            f"pods, so a request found its tenant's system prompt cached only when an earlier "
            f"request of the same tenant had happened to land on the same pod: {total[rr]} of "
            f"{prompt_tokens} prompt tokens hit."),
        "prefix_aware": Answer(
            total[pp],
            explanation=f"The prefix scorer sent each tenant to {', '.join(str(spread[pp][t]) for t in spread[pp])} "
            f"pod(s), using {len(set(placed[pp]))} of the {PODS} pods (a new tenant goes to the least "
            f"loaded pod; the rest follow their prefix): a request that found its tenant's "
            f"{SYSTEM_LEN // BLOCK_SIZE} system-prompt blocks on its pod reused {SYSTEM_LEN} tokens, "
            f"{total[pp]} prompt tokens in all, against {total[rr]} for round-robin."),
        "fleet": Answer(
            {r: round(100 * rate[r], 1) for r in FLEET_ROUTERS}, option=best,
            explanation=f"On {FLEET_REQUESTS} requests of the conversation trace over {PODS} pods of "
            f"{FLEET_BLOCKS} blocks: " + ", ".join(f"{r} {pct(rate[r])}" for r in FLEET_ROUTERS)
            + f". What was reachable (the longest prefix any pod held at admission) was "
            f"{pct(reach[rr])} under round-robin: the router, not the memory, lost "
            f"{pct(fleet[rr]['router_loss'])} of the prompt tokens."),
    }
    charts = [
        bars("Prompt tokens served from the cache, 16 requests on 4 pods", list(ROUTERS),
             {"hit tokens (engine)": [total[r] for r in ROUTERS]}, y_label="tokens",
             note="each pod a real engine; the router is kvscope simulate's"),
        bars(f"Hit rate at fleet scale ({FLEET_REQUESTS} Mooncake-format requests, {PODS} pods)",
             list(FLEET_ROUTERS), {"achieved (%)": [round(100 * rate[r], 1) for r in FLEET_ROUTERS],
                                   "reachable (%)": [round(100 * reach[r], 1) for r in FLEET_ROUTERS]},
             y_label="% of prompt tokens", note="kvscope simulate: the engine's core, no model"),
        table("Where each request went", ["request", *ROUTERS, *(f"hit tokens ({r})" for r in ROUTERS)],
              [[q.request_id, *(placed[r][i] for r in ROUTERS), *(hits[r].get(q.request_id, 0) for r in ROUTERS)]
               for i, q in enumerate(reqs)]),
    ]
    facts = {"hit_tokens": total, "pods_per_tenant": spread, "prompt_tokens": prompt_tokens,
             "fleet_hit_rate": {r: pct(rate[r]) for r in FLEET_ROUTERS},
             "fleet_reachable": {r: pct(reach[r]) for r in FLEET_ROUTERS}}
    return LessonResult(answers, charts, focus, facts)


QUESTIONS = (
    Question("round_robin", f"{PODS * PER_TENANT} requests from {len(TENANTS)} tenants (each with a "
             f"{SYSTEM_LEN}-token system prompt) go round-robin to {PODS} pods. How many prompt "
             "tokens hit the prefix cache in all?"),
    Question("prefix_aware", "The same requests, routed by llm-d's precise prefix scorer. How many "
             "prompt tokens hit now?"),
    Question("fleet", "At fleet scale, on a real conversation trace, which router gets the highest "
             "hit rate?", FLEET_ROUTERS),
)

LESSON = Lesson(
    number=9, slug="prefix-routing", title="Routing by prefix",
    short="prefix routing", sections=SECTIONS, questions=QUESTIONS,
    takeaway="A prefix cache is per pod: behind a load balancer it hits only when requests "
    "sharing a prefix land together. A router that reads the pods' KV events sends them "
    "there; round-robin throws most of the reachable hits away.",
    run=run, models=(FULL_BLOCK_HASHING, HIT_CAP, PREFIX_ROUTING),
)
