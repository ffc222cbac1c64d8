"""Plain-text rendering of a pool snapshot (``kvscope replay``, ``kvscope lesson``).

Reads a snapshot dict (see ``engine.events.reducer``); never changes it.
"""

from __future__ import annotations

from typing import Any

FREE, CACHED, USED, SHARED = ".", "c", "#", "S"
LEGEND = (f"legend: {USED} in use   {SHARED} shared (ref>1)   "
          f"{CACHED} free but cached (hittable, evicted LRU)   {FREE} free")


def block_char(block: dict[str, Any]) -> str:
    """One character for a block's state."""
    ref = block["ref_count"]
    if ref > 1:
        return SHARED
    if ref == 1:
        return USED
    return CACHED if block["hash"] is not None else FREE


def render_grid(snapshot: dict[str, Any], width: int = 32) -> str:
    """The block grid: one char per block, ``width`` per row, each row led by its first id."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    blocks = snapshot["blocks"]
    chars = [block_char(b) for b in blocks]
    counts = {c: chars.count(c) for c in (USED, SHARED, CACHED, FREE)}
    lines = [f"pool at step {snapshot['step']}: {snapshot['num_blocks']} blocks x "
             f"{snapshot['block_size']} slots | in use {counts[USED] + counts[SHARED]} "
             f"(shared {counts[SHARED]}) | free {counts[CACHED] + counts[FREE]} "
             f"(cached {counts[CACHED]})"]
    id_w = len(str(max(len(blocks) - 1, 0)))
    for start in range(0, len(chars), width):
        row = chars[start:start + width]
        # a space every 8 blocks keeps ids countable by eye
        groups = " ".join("".join(row[i:i + 8]) for i in range(0, len(row), 8))
        lines.append(f"  {start:>{id_w}} {groups}")
    lines.append(LEGEND)
    queue = snapshot["free_queue"]
    shown = " ".join(str(b) for b in queue[:24]) + (" ..." if len(queue) > 24 else "")
    lines.append(f"free queue (head, reused next -> tail, evicted last): {shown or '(empty)'}")
    return "\n".join(lines)


def render_tables(snapshot: dict[str, Any]) -> str:
    """Each request's block table: logical -> physical [filled/block_size], arrival order."""
    bs = snapshot["block_size"]
    refs = {b["id"]: b["ref_count"] for b in snapshot["blocks"]}
    reqs = sorted(snapshot["requests"].items(), key=lambda kv: (kv[1]["arrival_index"], kv[0]))
    if not reqs:
        return "requests: none"
    lines = ["requests (arrival order); entries are logical->physical [filled/slots], "
             "* = shared block"]
    for rid, r in reqs:
        parent = f" fork of {r['parent_id']}" if r.get("parent_id") else ""
        lines.append(f"  {rid}: {r['status']}{parent} | tokens {r['num_tokens']} "
                     f"computed {r['num_computed_tokens']} cached {r['num_cached_tokens']}")
        if not r["block_table"]:
            lines.append("    (no blocks)")
            continue
        cells = []
        for i, b in enumerate(r["block_table"]):
            fill = min(max(r["num_computed_tokens"] - i * bs, 0), bs)
            cells.append(f"{i}->{b}{'*' if refs.get(b, 0) > 1 else ''} [{fill}/{bs}]")
        for i in range(0, len(cells), 6):
            lines.append("    " + "  ".join(cells[i:i + 6]))
    return "\n".join(lines)


def render_snapshot(snapshot: dict[str, Any], width: int = 32) -> str:
    """Grid, legend, free queue, then every request's block table."""
    return render_grid(snapshot, width) + "\n\n" + render_tables(snapshot)
