"""What each physical block is, who owns it and what it holds: the grid's data.

Pure functions over a ``PoolSnapshot`` (``engine.events.folds.pool_snapshot``) and the
last step's events; the figures only draw what these return.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.events.folds.pool_snapshot import BlockView, PoolSnapshot
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, Event, PrefixHit,
    RequestForked,
)

from dashboard import palette

_MAX_IDS_SHOWN = 16  # hover boxes must stay readable; 16 ids covers a default block


def block_state(block: BlockView) -> str:
    """The palette state of one snapshot block (its ``BlockState``)."""
    return block.state


def owners(snapshot: PoolSnapshot) -> dict[int, list[tuple[str, int]]]:
    """block id → [(request id, logical index)] of every table that points at it."""
    return snapshot.owners()


def changes(events: Iterable[Event]) -> dict[int, list[str]]:
    """block id → short notes of what the events did to it (for highlight and hover)."""
    out: dict[int, list[str]] = {}

    def note(b: int, text: str) -> None:
        out.setdefault(b, []).append(text)

    for e in events:
        t = type(e)
        if t is BlockAllocated:
            note(e.block, f"allocated to {e.request_id}[{e.logical_index}]")
        elif t is BlockFreed:
            note(e.block, f"released by {e.request_id} (ref → {e.ref_count})")
        elif t is BlockCached:
            note(e.block, f"cached as {e.hash[:8]}")
        elif t is BlockEvicted:
            note(e.block, f"evicted hash {e.hash[:8]} ({e.reason})")
        elif t is PrefixHit:
            for b in e.blocks:
                note(b, f"prefix hit for {e.request_id}")
        elif t is CowCopy:
            note(e.src, f"copy-on-write source for {e.request_id}")
            note(e.dst, f"copy-on-write copy for {e.request_id}")
        elif t is RequestForked:
            for b in e.blocks:
                note(b, f"shared with fork {e.request_id}")
    return out


def block_tokens(snapshot: PoolSnapshot, block: BlockView,
                 owned: list[tuple[str, int]]) -> list[int]:
    """The token ids a block holds: its cached ids, else its first owner's slice."""
    if block.token_ids:
        return list(block.token_ids)
    if not owned:
        return []
    rid, i = owned[0]
    bs = snapshot.block_size
    r = snapshot.requests[rid]
    return list((r.token_ids or ())[i * bs:i * bs + r.fill(i, bs)])


@dataclass(slots=True)
class GridData:
    """Columnar per-block data, indexed by block id."""

    states: list[str]
    hover: list[str]
    changed: dict[int, list[str]]
    counts: dict[str, int]


def grid_data(snapshot: PoolSnapshot, events: Iterable[Event] = (),
              token_text: Any = None) -> GridData:
    """States, hover text and last-step changes of every block.

    ``token_text``, when given, turns a list of token ids into display text (the
    server may send it); otherwise the hover shows ids, as the dashboard has no
    tokenizer (it must not import transformers)."""
    bs = snapshot.block_size
    own = snapshot.owners()
    changed = changes(events)
    states, hover = [], []
    counts = dict.fromkeys(palette.BLOCK_STATES, 0)
    for b in snapshot.blocks:
        i = b.id
        st = b.state
        states.append(st)
        counts[st] += 1
        owned = own.get(i, [])
        lines = [f"<b>block {i}</b> · {palette.BLOCK_LABELS[st]} · ref {b.ref_count}",
                 f"slots filled {b.num_tokens}/{bs}"]
        if owned:
            who = ", ".join(f"{rid}[{li}]" for rid, li in owned[:6])
            more = f" +{len(owned) - 6}" if len(owned) > 6 else ""
            lines.append(f"owners: {who}{more}")
        if b.hash:
            lines.append(f"hash {b.hash[:12]}…")
        toks = block_tokens(snapshot, b, owned) if (owned or b.hash) else []
        if toks:
            if token_text is not None:
                lines.append("text: " + repr(token_text(toks))[:80])
            shown = ", ".join(map(str, toks[:_MAX_IDS_SHOWN]))
            lines.append(f"token ids: [{shown}{', …' if len(toks) > _MAX_IDS_SHOWN else ''}]")
        if i in changed:
            lines.append("<i>last step: " + "; ".join(changed[i][:4]) + "</i>")
        hover.append("<br>".join(lines))
    return GridData(states, hover, changed, counts)


def request_rows(snapshot: PoolSnapshot) -> list[dict[str, Any]]:
    """Requests in arrival order with their tables and the fill of each entry."""
    bs = snapshot.block_size
    rows = []
    for r in snapshot.by_arrival():
        table = r.block_table
        rows.append({"request_id": r.request_id, "status": str(r.status),
                     "parent_id": r.parent_id, "num_tokens": r.num_tokens,
                     "num_computed_tokens": r.num_computed_tokens,
                     "num_cached_tokens": r.num_cached_tokens, "table": list(table),
                     "fills": [r.fill(i, bs) for i in range(len(table))],
                     "states": [palette.SHARED if snapshot.blocks[b].ref_count > 1
                                else palette.USED for b in table]})
    return rows
