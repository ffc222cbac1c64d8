"""What each physical block is, who owns it and what it holds: the grid's data.

Pure functions over a pool snapshot (shape in ``engine.events.reducer``) and the
last step's events; the figures only draw what these return.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.events import types as T

from dashboard import palette as P

_MAX_IDS_SHOWN = 16  # hover boxes must stay readable; 16 ids covers a default block


def block_state(block: dict[str, Any]) -> str:
    """The palette state of one snapshot block (same rule as ``render.block_char``)."""
    ref = block["ref_count"]
    if ref > 1:
        return P.SHARED
    if ref == 1:
        return P.USED
    return P.CACHED if block["hash"] is not None else P.FREE


def owners(snapshot: dict[str, Any]) -> dict[int, list[tuple[str, int]]]:
    """block id → [(request id, logical index)] of every table that points at it."""
    out: dict[int, list[tuple[str, int]]] = {}
    for rid, r in snapshot["requests"].items():
        for i, b in enumerate(r["block_table"]):
            out.setdefault(b, []).append((rid, i))
    return out


def changes(events: Iterable[T.Event]) -> dict[int, list[str]]:
    """block id → short notes of what the events did to it (for highlight and hover)."""
    out: dict[int, list[str]] = {}

    def note(b: int, text: str) -> None:
        out.setdefault(b, []).append(text)

    for e in events:
        t = type(e)
        if t is T.BlockAllocated:
            note(e.block, f"allocated to {e.request_id}[{e.logical_index}]")
        elif t is T.BlockFreed:
            note(e.block, f"released by {e.request_id} (ref → {e.ref_count})")
        elif t is T.BlockCached:
            note(e.block, f"cached as {e.hash[:8]}")
        elif t is T.BlockEvicted:
            note(e.block, f"evicted hash {e.hash[:8]}")
        elif t is T.PrefixHit:
            for b in e.blocks:
                note(b, f"prefix hit for {e.request_id}")
        elif t is T.CowCopy:
            note(e.src, f"copy-on-write source for {e.request_id}")
            note(e.dst, f"copy-on-write copy for {e.request_id}")
        elif t is T.RequestForked:
            for b in e.blocks:
                note(b, f"shared with fork {e.request_id}")
    return out


def block_tokens(snapshot: dict[str, Any], block: dict[str, Any],
                 owned: list[tuple[str, int]]) -> list[int]:
    """The token ids a block holds: its cached ids, else its first owner's slice."""
    if block.get("token_ids"):
        return list(block["token_ids"])
    if not owned:
        return []
    rid, i = owned[0]
    bs = snapshot["block_size"]
    r = snapshot["requests"][rid]
    fill = min(max(r["num_computed_tokens"] - i * bs, 0), bs)
    return list(r["token_ids"][i * bs:i * bs + fill])


@dataclass(slots=True)
class GridData:
    """Columnar per-block data, indexed by block id."""

    states: list[str]
    hover: list[str]
    changed: dict[int, list[str]]
    counts: dict[str, int]


def grid_data(snapshot: dict[str, Any], events: Iterable[T.Event] = (),
              token_text: Any = None) -> GridData:
    """States, hover text and last-step changes of every block.

    ``token_text``, when given, turns a list of token ids into display text (the
    server may send it); otherwise the hover shows ids, as the dashboard has no
    tokenizer (it must not import transformers)."""
    bs = snapshot["block_size"]
    own = owners(snapshot)
    changed = changes(events)
    states, hover = [], []
    counts = dict.fromkeys(P.BLOCK_STATES, 0)
    for b in snapshot["blocks"]:
        i = b["id"]
        st = block_state(b)
        states.append(st)
        counts[st] += 1
        owned = own.get(i, [])
        lines = [f"<b>block {i}</b> · {P.BLOCK_LABELS[st]} · ref {b['ref_count']}",
                 f"slots filled {b['num_tokens']}/{bs}"]
        if owned:
            who = ", ".join(f"{rid}[{li}]" for rid, li in owned[:6])
            more = f" +{len(owned) - 6}" if len(owned) > 6 else ""
            lines.append(f"owners: {who}{more}")
        if b["hash"]:
            lines.append(f"hash {b['hash'][:12]}…")
        toks = block_tokens(snapshot, b, owned) if (owned or b["hash"]) else []
        if toks:
            if token_text is not None:
                lines.append("text: " + repr(token_text(toks))[:80])
            shown = ", ".join(map(str, toks[:_MAX_IDS_SHOWN]))
            lines.append(f"token ids: [{shown}{', …' if len(toks) > _MAX_IDS_SHOWN else ''}]")
        if i in changed:
            lines.append("<i>last step: " + "; ".join(changed[i][:4]) + "</i>")
        hover.append("<br>".join(lines))
    return GridData(states, hover, changed, counts)


def request_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests in arrival order with their tables and the fill of each entry."""
    bs = snapshot["block_size"]
    refs = [b["ref_count"] for b in snapshot["blocks"]]
    rows = []
    reqs = sorted(snapshot["requests"].items(),
                  key=lambda kv: (kv[1].get("arrival_index", 0), kv[0]))
    for rid, r in reqs:
        c = r["num_computed_tokens"]
        fills = [min(max(c - i * bs, 0), bs) for i in range(len(r["block_table"]))]
        states = [P.SHARED if refs[b] > 1 else P.USED for b in r["block_table"]]
        rows.append({"request_id": rid, "status": r["status"], "parent_id": r.get("parent_id"),
                     "num_tokens": r["num_tokens"], "num_computed_tokens": c,
                     "num_cached_tokens": r.get("num_cached_tokens", 0),
                     "table": list(r["block_table"]), "fills": fills, "states": states})
    return rows
