"""Plain-text rendering of a pool snapshot (``kvscope replay``, ``kvscope lesson``).

Reads a ``PoolSnapshot``; never changes it.
"""

from __future__ import annotations

from engine.events.folds.pool_snapshot import BlockState, BlockView, PoolSnapshot

FREE, CACHED, USED, SHARED = ".", "c", "#", "S"
_CHARS = {BlockState.FREE: FREE, BlockState.CACHED: CACHED, BlockState.USED: USED,
          BlockState.SHARED: SHARED}
LEGEND = (f"legend: {USED} in use   {SHARED} shared (ref>1)   "
          f"{CACHED} free but cached (hittable, evicted LRU)   {FREE} free")


def block_char(block: BlockView) -> str:
    """One character for a block's state."""
    return _CHARS[block.state]


def render_grid(snapshot: PoolSnapshot, width: int = 32) -> str:
    """The block grid: one char per block, ``width`` per row, each row led by its first id."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    blocks = snapshot.blocks
    chars = [block_char(b) for b in blocks]
    counts = {c: chars.count(c) for c in (USED, SHARED, CACHED, FREE)}
    lines = [f"pool at step {snapshot.step}: {snapshot.num_blocks} blocks x "
             f"{snapshot.block_size} slots | in use {counts[USED] + counts[SHARED]} "
             f"(shared {counts[SHARED]}) | free {counts[CACHED] + counts[FREE]} "
             f"(cached {counts[CACHED]})"]
    id_w = len(str(max(len(blocks) - 1, 0)))
    for start in range(0, len(chars), width):
        row = chars[start:start + width]
        # a space every 8 blocks keeps ids countable by eye
        groups = " ".join("".join(row[i:i + 8]) for i in range(0, len(row), 8))
        lines.append(f"  {start:>{id_w}} {groups}")
    lines.append(LEGEND)
    queue = snapshot.free_queue
    shown = " ".join(str(b) for b in queue[:24]) + (" ..." if len(queue) > 24 else "")
    lines.append(f"free queue (head, reused next -> tail, evicted last): {shown or '(empty)'}")
    return "\n".join(lines)


def render_tables(snapshot: PoolSnapshot) -> str:
    """Each request's block table: logical -> physical [filled/block_size], arrival order."""
    bs = snapshot.block_size
    reqs = snapshot.by_arrival()
    if not reqs:
        return "requests: none"
    lines = ["requests (arrival order); entries are logical->physical [filled/slots], "
             "* = shared block"]
    for r in reqs:
        parent = f" fork of {r.parent_id}" if r.parent_id else ""
        lines.append(f"  {r.request_id}: {r.status}{parent} | tokens {r.num_tokens} "
                     f"computed {r.num_computed_tokens} cached {r.num_cached_tokens}")
        if not r.block_table:
            lines.append("    (no blocks)")
            continue
        cells = [f"{i}->{b}{'*' if snapshot.blocks[b].ref_count > 1 else ''} "
                 f"[{r.fill(i, bs)}/{bs}]" for i, b in enumerate(r.block_table)]
        for i in range(0, len(cells), 6):
            lines.append("    " + "  ".join(cells[i:i + 6]))
    return "\n".join(lines)


def render_snapshot(snapshot: PoolSnapshot, width: int = 32) -> str:
    """Grid, legend, free queue, then every request's block table."""
    return render_grid(snapshot, width) + "\n\n" + render_tables(snapshot)
