"""Text rendering of snapshots."""

import pytest

from engine.events.folds.reducer import PoolState
from engine.events.render import render_grid, render_snapshot, render_tables
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockFreed, PrefixLookup, RequestArrived, RequestFinished,
    RequestForked, RequestProgress, RequestScheduled,
)


def state():
    s = PoolState(10, 4)
    s.apply_events([
        RequestArrived(1, "a", 6), PrefixLookup(1, "a", 6, 0, 4, 0, 2, 0),
        BlockAllocated(1, 0, "a", 0), BlockAllocated(1, 1, "a", 1),
        RequestScheduled(1, "a", 6, "prefill"), RequestProgress(1, "a", 7, 6, (9,)),
        BlockCached(1, 0, "h0", None, (1, 2, 3, 4)),
        RequestForked(1, "a.1", "a", (0, 1), 7, 6, (), 1),
        RequestArrived(1, "b", 4, arrival_index=2), PrefixLookup(1, "b", 4, 0, 4, 0, 0, 0),
        BlockAllocated(1, 2, "b", 0), RequestScheduled(1, "b", 4, "prefill"),
        RequestProgress(1, "b", 5, 4, (9,)), BlockCached(1, 2, "h2", None, (5, 6, 7, 8)),
        BlockFreed(2, 2, "b", 0), RequestFinished(2, "b", "stop"),
        RequestArrived(2, "w", 3, arrival_index=3),
    ])
    return s.to_snapshot()


def test_grid_chars_and_counts():
    text = render_grid(state(), width=8)
    lines = text.splitlines()
    assert lines[0] == ("pool at step 2: 10 blocks x 4 slots | in use 2 (shared 2) | "
                        "free 8 (cached 1)")
    assert lines[1] == "  0 SSc....."
    assert lines[2] == "  8 .."
    assert lines[3].startswith("legend:")
    assert lines[4].endswith("3 4 5 6 7 8 9 2")


def test_tables_show_fill_and_sharing():
    text = render_tables(state())
    assert "  a: running | tokens 7 computed 6 cached 0" in text
    assert "    0->0* [4/4]  1->1* [2/4]" in text
    assert "  a.1: running fork of a" in text
    assert "  w: waiting | tokens 3 computed 0 cached 0\n    (no blocks)" in text
    assert text.index("a.1:") < text.index("w:")  # arrival order


def test_snapshot_combines_and_validates_width():
    assert "legend" in render_snapshot(state()) and "requests" in render_snapshot(state())
    with pytest.raises(ValueError):
        render_grid(state(), width=0)
