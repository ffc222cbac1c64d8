"""One row per pod: what the fleet page, the fidelity monitor and attach's /metrics show.

``pod_row`` joins what the three writers of an attached pod know:

- the pod's subscription (``PodSubscription.counters()``): batches received live or replayed
  (``history`` at the attach, ``gap`` fills, the ``tail`` after a quiet spell), sequence gaps
  seen and filled, holes and the batches lost in them (unfilled gaps, history replay no longer
  had, undecodable batches), publisher restarts (seq back to 0), duplicate batches (a replay
  overlapping the live stream), bad messages, replay failures, the dialects seen
  (``engine.attach.wire``) and the wall time of the latest batch;
- the fold (``HashCacheState``'s pod): cached blocks, removals of hashes never stored, clears;
- the ledger (``engine.attach.ledger.PodLedger``): churn (blocks stored / removed / evicted per
  minute, the share evicted before any certain reuse), placement (achieved against reachable
  hits of the requests seen starting or branching on the pod; ``fleet_placement`` sums them),
  the miss explainer's sums (``miss_tokens`` by cause for those requests, ``probe_misses`` by
  cause for the locator's probes), the peak cached blocks, duplicate and placeholder stores.

**Completeness** is the share of the pod's batches, as numbered by its publisher up to the
latest one seen, that were applied: ``received / (received + lost_batches)`` (None before any).
1.0 means the index saw every batch the pod published since its start (or since the attach,
when replay could return the history); a removal of a hash never stored with a completeness
of 1.0 is the publisher's own oddity, not a loss on the way.

The attach worker puts the rows in its steps (``metrics["fleet"][pod]``), so the dashboard
draws them live and from a stored run alike; the scraped figures (hit rate, usage) ride next
to them in ``metrics["scraped"]``.

``overview`` turns the rows into the fleet page's table: headline figures, the age of each
pod's latest batch, and alerts (no batch yet, batches lost, restarts, removals of hashes never
stored, quiet past ``QUIET_ALERT_S``, a failed scrape).

Pure: plain values in, plain dicts out.
"""

from __future__ import annotations

from typing import Any

from engine.attach.ledger import PodLedger
from engine.attach.wire import dialect_key
from engine.events.metrics.occupancy import TokenUsageBound

FIDELITY_KEYS = ("received", "gaps", "gaps_filled", "holes", "lost_batches", "restarts",
                 "duplicate_batches", "bad_messages", "replay_failures")


def completeness(received: int, lost: int) -> float | None:
    return None if received + lost == 0 else received / (received + lost)


def pod_row(counters: dict[str, Any], pod: Any | None, ledger: PodLedger | None) -> dict[str, Any]:
    """The pod's row; ``pod`` is the fold's pod (``HashCacheState.pods[name]``) or None."""
    fills = counters.get("fills") or {}
    row: dict[str, Any] = {k: counters.get(k, 0) for k in FIDELITY_KEYS}
    row.update(live=fills.get("live", 0), replayed_history=fills.get("history", 0),
               replayed_gap=fills.get("gap", 0), replayed_tail=fills.get("tail", 0),
               undecodable=fills.get("undecodable", 0),
               gaps_unfilled=row["gaps"] - row["gaps_filled"],
               dialects=dict(counters.get("dialects") or {}), dialect=counters.get("dialect") or {},
               last_batch_wall=counters.get("last_batch_wall"),
               completeness=completeness(row["received"], row["lost_batches"]))
    row.update(cached_blocks=0 if pod is None else len(pod.blocks),
               stored_blocks=0 if pod is None else pod.stored_blocks,
               removed_blocks=0 if pod is None else pod.removed_blocks,
               unknown_removals=0 if pod is None else pod.unknown_removals,
               clears=0 if pod is None else pod.clears,
               block_size=None if pod is None else pod.block_size,
               gpu_stored_copies=0 if pod is None else sum(b.copies for b in pod.blocks.values()
                                                           if b.medium in GPU_MEDIUMS),
               last_ts=None if pod is None else pod.last_ts)
    led = ledger if ledger is not None else PodLedger("")
    row.update(led.churn(), **led.placement(), **led.misses(), peak_blocks=led.peak_blocks,
               duplicate_stores=led.duplicate_stores, placeholder_stores=led.placeholder_stores)
    return row


GPU_MEDIUMS = ("GPU", None)  # the engine's own pool (an event without a medium is vLLM's GPU)


def token_usage(r: dict[str, Any]) -> tuple[float | None, float | None]:
    """(low, high) of the pod's token usage, the filled token slots' share of the pool (issue 31
    item 6, ``engine.events.metrics.occupancy``): exact (low == high) where the pod exports it
    (kvscope's ``kvscope_kv_token_usage``); else ``TokenUsageBound`` from its scraped block usage
    and pool size and the stored copies the events say it holds, only while the stream is
    complete (a lost batch leaves the copies unknown); else (None, None)."""
    sc = r.get("scraped") or {}
    if sc.get("kv_token_usage") is not None:
        return sc["kv_token_usage"], sc["kv_token_usage"]
    usage, blocks = sc.get("kv_cache_usage"), sc.get("num_gpu_blocks")
    if usage is None or not blocks or r.get("completeness") != 1.0 or r.get("restarts"):
        return None, None
    try:
        b = TokenUsageBound.of_vllm(blocks, usage, r.get("gpu_stored_copies", 0))
    except ValueError:
        return None, None
    return b.low, b.high


QUIET_ALERT_S = 60.0  # a pod silent this long (wall clock) is flagged: are its events reaching us?


def overview(rows: dict[str, dict[str, Any]], now_wall: float) -> list[dict[str, Any]]:
    """The fleet page's rows: per pod its row's headline figures, the scraped hit rate and
    usage (``row["scraped"]``), the age of its latest batch at ``now_wall`` and what to look at
    (``alerts``)."""
    out = []
    for pod, r in rows.items():
        sc = r.get("scraped") or {}
        last = r.get("last_batch_wall")
        age = None if last is None else max(0.0, now_wall - last)
        alerts = []
        if not r.get("received") and not r.get("lost_batches"):
            alerts.append("no batch received yet")
        if r.get("lost_batches"):
            alerts.append(f"{r['lost_batches']} batch(es) lost in {r.get('holes', 0)} hole(s)")
        if r.get("restarts"):
            alerts.append(f"publisher restarted {r['restarts']}x")
        if r.get("unknown_removals"):
            alerts.append(f"{r['unknown_removals']} removal(s) of hashes never stored")
        if age is not None and age > QUIET_ALERT_S:
            alerts.append(f"quiet for {age:.0f} s")
        if sc.get("error"):
            alerts.append("the last /metrics scrape failed")
        d = r.get("dialect") or {}
        low, high = token_usage(r)
        out.append({"pod": pod, "cached_blocks": r.get("cached_blocks", 0), "block_size": r.get("block_size"),
                    "stored_per_min": r.get("stored_per_min", 0.0),
                    "removed_per_min": r.get("removed_per_min", 0.0),
                    "evicted_per_min": r.get("evicted_per_min", 0.0),
                    "evicted_blocks": r.get("evicted_blocks", 0),
                    "evicted_before_reuse_share": r.get("evicted_before_reuse_share"),
                    "hit_rate": sc.get("prefix_cache_hit_rate"), "kv_usage": sc.get("kv_cache_usage"),
                    "token_usage_low": low, "token_usage_high": high,
                    "completeness": r.get("completeness"), "gaps_unfilled": r.get("gaps_unfilled", 0),
                    "achieved_hit_rate": r.get("achieved_hit_rate"),
                    "reachable_hit_rate": r.get("reachable_hit_rate"), "placed_chains": r.get("placed_chains", 0),
                    "restarts": r.get("restarts", 0), "last_event_age_s": age,
                    "dialect": None if not d else dialect_key(d), "alerts": alerts})
    return out


def fleet_placement(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Achieved against reachable over the whole fleet: the rows' block counts summed."""
    n = sum(r.get("placed_blocks", 0) for r in rows.values())
    got = sum(r.get("achieved_blocks", 0) for r in rows.values())
    best = sum(r.get("reachable_blocks", 0) for r in rows.values())
    return {"placed_chains": sum(r.get("placed_chains", 0) for r in rows.values()), "placed_blocks": n,
            "achieved_blocks": got, "reachable_blocks": best,
            "achieved_hit_rate": got / n if n else None, "reachable_hit_rate": best / n if n else None,
            "lost_blocks": best - got}


ENGINE_CAUSES = ("cold", "evicted", "partial")  # an engine run's own (engine.core.miss_causes)
# the attach causes as the engine's three read them: cold = never cached; evicted = cached once
# (or under this very hash: recomputed); partial = the shared prefix ended inside the block, or
# the block holds the last prompt token, or fills no block
AS_ENGINE_CAUSE = {"never_stored": "cold", "other_keys": "cold", "no_blocks": "cold",
                   "evicted": "evicted", "cleared": "evicted", "restart": "evicted",
                   "diverged": "partial", "last_token": "partial", "partial_block": "partial",
                   "below_block": "partial"}


def miss_explainer(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pod, the missed tokens by cause: of the requests seen in the events (``events``),
    of the locator's probes (``probes``), both also in the engine's three causes
    (``AS_ENGINE_CAUSE``), beside the engine's own counts where its /metrics export them
    (kvscope's ``kvscope_prefix_cache_misses_total{cause}``: ``engine``)."""
    out = []
    for pod, r in rows.items():
        sc = r.get("scraped") or {}
        events, probes = dict(r.get("miss_tokens") or {}), dict(r.get("probe_misses") or {})
        engine = {c: sc[f"prefix_cache_miss_{c}"] for c in ENGINE_CAUSES if f"prefix_cache_miss_{c}" in sc}
        out.append({"pod": pod, "events": events, "events_as_engine": as_engine(events),
                    "missed_tokens": sum(events.values()),
                    "probes": probes, "probes_as_engine": as_engine(probes), "num_probes": r.get("probes", 0),
                    "probe_missed_tokens": r.get("probe_prompt_tokens", 0) - r.get("probe_hit_tokens", 0),
                    "engine": engine or None})
    return out


def as_engine(causes: dict[str, int]) -> dict[str, int]:
    """Attach's causes summed into the engine's cold / evicted / partial."""
    out = dict.fromkeys(ENGINE_CAUSES, 0)
    for cause, n in causes.items():
        out[AS_ENGINE_CAUSE.get(cause, "cold")] += n
    return out
