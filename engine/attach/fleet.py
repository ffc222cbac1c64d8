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
  minute, the share evicted before any certain reuse), duplicate and placeholder stores.

**Completeness** is the share of the pod's batches, as numbered by its publisher up to the
latest one seen, that were applied: ``received / (received + lost_batches)`` (None before any).
1.0 means the index saw every batch the pod published since its start (or since the attach,
when replay could return the history); a removal of a hash never stored with a completeness
of 1.0 is the publisher's own oddity, not a loss on the way.

The attach worker puts the rows in its steps (``metrics["fleet"][pod]``), so the dashboard
draws them live and from a stored run alike; the scraped figures (hit rate, usage) ride next
to them in ``metrics["scraped"]``.

Pure: plain values in, a plain dict out.
"""

from __future__ import annotations

from typing import Any

from engine.attach.ledger import PodLedger

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
               last_ts=None if pod is None else pod.last_ts)
    if ledger is not None:
        row.update(ledger.churn(), duplicate_stores=ledger.duplicate_stores,
                   placeholder_stores=ledger.placeholder_stores)
    else:
        row.update(evicted_blocks=0, evicted_before_reuse=0, evicted_before_reuse_share=None,
                   evicted_per_min=0.0, stored_per_min=0.0, removed_per_min=0.0,
                   recomputed_after_removal=0, duplicate_stores=0, placeholder_stores=0)
    return row
