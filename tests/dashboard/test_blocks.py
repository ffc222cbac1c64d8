"""The grid's data: block states, owners, last-step changes, request rows (pure)."""

from __future__ import annotations

from engine.events.folds.pool_snapshot import BlockView
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, PrefixHit,
)

from dashboard import palette
from dashboard.blocks import block_state, changes, grid_data, owners, request_rows
from dashboard.event_log import event_rows, step_summary
from tests.core.driver import make_scheduler, req, step


def _forked_pool():
    """One request forked into 2 samples: shared prompt blocks, then a cow copy."""
    s = make_scheduler(block_size=4, num_blocks=16)
    s.add_request(req("a", list(range(10)), max_tokens=4, n=2))
    step(s)
    s.log.drain()
    step(s)
    return s.snapshot(), s.log.drain()


def test_block_states_follow_ref_count_and_hash():
    def view(ref, h):
        return BlockView(0, ref, h, 0, None)

    assert block_state(view(0, None)) == palette.FREE
    assert block_state(view(0, "ab")) == palette.CACHED
    assert block_state(view(1, "ab")) == palette.USED
    assert block_state(view(3, None)) == palette.SHARED


def test_grid_data_counts_owners_and_hover():
    snap, events = _forked_pool()
    d = grid_data(snap, events)
    assert len(d.states) == snap.num_blocks == sum(d.counts.values())
    own = owners(snap)
    shared = [i for i, s in enumerate(d.states) if s == palette.SHARED]
    assert shared, "the fork shares its prompt blocks"
    for i in shared:
        assert {rid for rid, _ in own[i]} == {"a", "a#1"}
        assert "owners: a[" in d.hover[i] and "ref 2" in d.hover[i]
    cows = [e for e in events if isinstance(e, CowCopy)]
    assert cows, "the first write into the shared partial block copies it"
    for e in cows:
        assert e.dst in d.changed and "copy-on-write copy" in d.hover[e.dst]


def test_hover_shows_token_ids_of_partial_blocks_and_text_when_given():
    snap, events = _forked_pool()
    d = grid_data(snap, events, token_text=lambda ids: "<" + ",".join(map(str, ids)) + ">")
    first = snap.requests["a"].block_table[0]
    assert "token ids: [0, 1, 2, 3]" in d.hover[first]
    assert "text: '<0,1,2,3>'" in d.hover[first]


def test_changes_name_every_block_event():
    ev = [BlockAllocated(1, 3, "r", 0), BlockFreed(1, 4, "r", 0),
          BlockCached(1, 3, "abcdef0123", None, (1, 2)), BlockEvicted(1, 5, "ffff0000"),
          PrefixHit(1, "q", (6, 7), 8), CowCopy(1, "r", 6, 8, 1, 1)]
    got = changes(ev)
    assert set(got) == {3, 4, 5, 6, 7, 8}
    assert got[3] == ["allocated to r[0]", "cached as abcdef01"]
    assert got[6] == ["prefix hit for q", "copy-on-write source for r"]


def test_request_rows_report_fill_of_each_entry():
    snap, _ = _forked_pool()
    rows = {r["request_id"]: r for r in request_rows(snap)}
    a = rows["a"]
    assert a["fills"][:2] == [4, 4] and 0 < a["fills"][-1] <= 4
    assert rows["a#1"]["parent_id"] == "a"
    assert a["states"][0] == palette.SHARED


def test_event_log_rows_and_summary():
    snap, events = _forked_pool()
    rows = event_rows(events)
    assert [r["event"] for r in rows] == [e.type for e in events]
    assert any(r["what"] == "copy-on-write copy" and "→" in r["blocks"] for r in rows)
    assert "copy-on-write copy" in step_summary(events)
    assert step_summary([]) == "no block changes"


def test_step_summary_pluralizes_and_tells_reset_drops_from_evictions():
    ev = ([CowCopy(1, f"r{i}", 6, 8 + i, 1, 1) for i in range(3)]
          + [BlockEvicted(1, b, f"h{b}", reason="reset") for b in range(62)]
          + [BlockEvicted(1, 70, "h70")])
    assert step_summary(ev) == ("3 copy-on-write copies · 62 cached hashes dropped by the "
                                "prefix-cache reset · 1 block evicted (LRU, reused)")
    assert step_summary([CowCopy(1, "r", 6, 8, 1, 1)]) == "1 copy-on-write copy"


def test_block_tables_always_label_physical_ids_and_keep_forks_together():
    from dashboard.figures.tables import family_order, id_font_px, tables_figure

    s = make_scheduler(block_size=4, num_blocks=64)
    s.add_request(req("a", list(range(10)), max_tokens=4, n=4))
    s.add_request(req("b", list(range(20, 26)), max_tokens=4))
    step(s)
    step(s)
    snap = s.snapshot()
    fig = tables_figure(snap)
    assert fig.layout.uniformtext.mode is None  # nothing is hidden for lack of room
    def rid(label):
        return label.split(" · ")[0].split(" (")[0].strip(" ↳")

    labels = list(fig.layout.yaxis.categoryarray)
    assert [rid(lb) for lb in labels] == ["a", "a#1", "a#2", "a#3", "b"]
    shown = {}
    for t in fig.data[1:]:  # the in-use and shared segments carry the ids as text
        assert t.textfont.size >= 6 and t.textposition == "inside"
        for y, base, text in zip(t.y, t.base, t.text):
            shown[(rid(y), base)] = int(text)
    for rid, r in snap.requests.items():  # every entry of every table, by its physical id
        for i, b in enumerate(r.block_table):
            assert shown[(rid, i)] == b
    # the label size shrinks with the columns a block gets, within 6..12 px
    assert id_font_px(4, 9) == 12 and id_font_px(200, 1455) == 6
    assert 6 < id_font_px(25, 150) < 12
    assert [r["request_id"] for r in family_order([
        {"request_id": "x#1", "parent_id": "x"}, {"request_id": "y", "parent_id": None},
        {"request_id": "x", "parent_id": None}])] == ["y", "x", "x#1"]
