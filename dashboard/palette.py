"""One palette for every page, so a colour means the same thing everywhere.

Block states are ``engine.events.folds.pool_snapshot.BlockState`` (one rule for every
view): free (ref 0, no hash), free-but-cached (ref 0 with a hash: hittable,
evicted LRU), in use (ref 1), shared (ref > 1). Things that relate share a hue on
purpose: a prefix hit reuses cached blocks (teal), a copy-on-write copy un-shares
a shared block (violet).
"""

from __future__ import annotations

from engine.events.folds.pool_snapshot import BlockState

# ---- block states (grid, block tables, legends) -----------------------------
FREE, CACHED, USED, SHARED = (BlockState.FREE, BlockState.CACHED, BlockState.USED,
                              BlockState.SHARED)
BLOCK_STATES = (FREE, CACHED, USED, SHARED)  # code = index (heatmap z)
BLOCK_COLORS = {
    FREE: "#E5E7EB",    # light grey: empty slot memory, nothing worth keeping
    CACHED: "#2DD4BF",  # teal: free but hittable until LRU eviction reuses it
    USED: "#3B82F6",    # blue: one request owns it
    SHARED: "#8B5CF6",  # violet: several requests read it (prefix hit or fork)
}
BLOCK_LABELS = {
    FREE: "free",
    CACHED: "free but cached (hittable, evicted LRU)",
    USED: "in use (ref 1)",
    SHARED: "shared (ref > 1)",
}
CHANGED = "#EF4444"  # red outline: touched by the last step's events

# ---- events over time ----------------------------------------------------------
EVICTION = "#F97316"    # orange: a cached hash was dropped to reuse its block
COW_COPY = BLOCK_COLORS[SHARED]
PREEMPTION = "#DC2626"  # red: a request lost its blocks and will recompute
EVENT_COLORS = {"eviction": EVICTION, "copy-on-write": COW_COPY, "preemption": PREEMPTION}

# ---- scheduler ------------------------------------------------------------------
PREFILL = "#0EA5E9"  # sky: prompt tokens (chunks)
DECODE = "#22C55E"   # green: one new token per running request
BUDGET = "#111827"   # near-black dashed line: max_num_batched_tokens
WAITING, RUNNING, PREEMPTED = "#F59E0B", "#3B82F6", PREEMPTION
REQUEST_STATUS_COLORS = {"waiting": WAITING, "running": RUNNING, "preempted": PREEMPTED}

# ---- prefix cache ------------------------------------------------------------
HIT = BLOCK_COLORS[CACHED]
MISS_COLORS = {
    "cold": "#94A3B8",      # slate: never cached
    "evicted": EVICTION,    # cached once, evicted since
    "partial": "#A3E635",   # lime: shorter than a full block (not waiting's amber)
    "disabled": "#475569",  # dark slate: prefix caching is off
}
# a resumed (preempted) request's lookup: counted apart from first admissions
RESUMED_HIT = "#99F6E4"         # pale teal: re-found in the cache after preemption
RECOMPUTED = "#FCA5A5"          # pale red: recomputed after preemption

# ---- memory split (paged vs contiguous) ----------------------------------------
MEMORY_COLORS = {
    "filled": BLOCK_COLORS[USED],          # slots holding a token's K/V
    "internal fragmentation": "#93C5FD",   # allocated slots of partial last blocks
    "reserved, unused": "#FCA5A5",         # contiguous over-reservation
    "stranded (external fragmentation)": "#F87171",
    "cached": BLOCK_COLORS[CACHED],
    "free": BLOCK_COLORS[FREE],
}

# ---- usage and latency series --------------------------------------------------
KV_CACHE_USAGE = "#1D4ED8"
KV_TOKEN_USAGE = "#60A5FA"
FRAGMENTATION = "#F43F5E"
TTFT, ITL = "#0EA5E9", "#A855F7"
RUN_A, RUN_B = "#2563EB", "#EA580C"  # compare page: left run, right run


# ---- one code across pages (lessons' charts name their series in words) -------
# (word in a series name, colour): the first match wins, so "preempted (waiting to
# recompute)" is preempted, not waiting.
CONCEPTS = (
    ("preempt", PREEMPTED), ("waiting", WAITING), ("running", RUNNING),
    ("evict", EVICTION), ("partial", MISS_COLORS["partial"]), ("cold", MISS_COLORS["cold"]),
    ("hit", HIT), ("copy", COW_COPY), ("cow", COW_COPY), ("fork", COW_COPY),
    ("prefill", PREFILL), ("decode", DECODE),
)


def color_for(name: str) -> str | None:
    """The colour of the concept a series name mentions (None: plotly's default)."""
    low = name.lower()
    return next((c for word, c in CONCEPTS if word in low), None)
