"""Token-free copies of what watchers see, for ``kvscope serve --redact-tokens``.

Without redaction every watcher (any client that connects: the dashboard, another
user's script) sees every request's token ids: prompts in ``request_arrived`` and
``request_forked``, outputs in ``request_progress``, block contents in
``block_cached`` and in snapshots. Redacted, the events keep every id, count and
hash (the dashboard still draws tables, sharing and hit rates) and carry no token
id; the submitter still gets its own outputs (``output``/``finished`` go to it
alone). Block hashes stay: they reveal which blocks hold equal tokens, which the
prefix cache's hit rates reveal anyway. Pure functions; no torch.
"""

from __future__ import annotations

import dataclasses

from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.schema.step import StepRecord
from engine.events.schema.types import BlockCached, Event, RequestArrived, RequestForked, RequestProgress

_FIELDS = {BlockCached: "token_ids", RequestArrived: "prompt_token_ids", RequestForked: "token_ids",
           RequestProgress: "new_token_ids"}


def redact_event(e: Event) -> Event:
    name = _FIELDS.get(type(e))
    return dataclasses.replace(e, **{name: ()}) if name is not None and getattr(e, name) else e


def redact_step(record: StepRecord) -> StepRecord:
    return dataclasses.replace(record, events=[redact_event(e) for e in record.events])


def redact_snapshot(snap: PoolSnapshot) -> PoolSnapshot:
    """The snapshot with every block's and request's ``token_ids`` None (as a snapshot
    built without tokens)."""
    return dataclasses.replace(
        snap, blocks=tuple(dataclasses.replace(b, token_ids=None) for b in snap.blocks),
        requests={rid: dataclasses.replace(r, token_ids=None) for rid, r in snap.requests.items()})
