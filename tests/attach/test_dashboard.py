"""The Attached view in the dashboard (Streamlit's AppTest): live on a running attach, and
on the stored run in Replay and on the Attached page; every tab, the prompt box."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.attached_view import TABS
from engine.store.runs import RunStore
from tests.attach.demo import SYSTEM, publish_demo, word_tokenizer
from tests.attach.fake_publisher import FakePublisher
from tests.attach.helpers import source, start_attach, wait_until
from tests.dashboard.conftest import APP, release_streamlit_resources
from tests.dashboard.test_pages import rerun_until


@pytest.fixture
def env(tmp_path, monkeypatch):
    a, b = FakePublisher(), FakePublisher(encoding="array", replay_layout=2)
    srv = start_attach(tmp_path, source(a, "pod-a"), source(b, "pod-b"),
                       tokenizer_file=word_tokenizer(tmp_path), label="demo deployment")
    a.wait_subscriber()
    b.wait_subscriber()
    # pod-a's batches are recorded before pod-b's: the replay test walks removal, then hole
    publish_demo(a, b, between=lambda: wait_until(lambda: len(srv.worker.state.cached("pod-a")) == 7,
                                                  what="pod-a's batches"))
    # pod-b's removal of 14 was lost in the hole: the fold still holds it (and says so)
    wait_until(lambda: srv.worker.state.cached("pod-b") == {f"{h:016x}" for h in (11, 12, 13, 14, 15)}
               and len(srv.worker.state.cached("pod-a")) == 7, what="the demo")
    monkeypatch.setenv("KVSCOPE_URL", srv.url)
    monkeypatch.setenv("KVSCOPE_DB", srv.options.db)
    monkeypatch.setenv("KVSCOPE_AUTOSTART", "0")
    yield srv
    release_streamlit_resources()
    srv.stop()
    a.close()
    b.close()


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption]
                     + [i.value for i in at.info] + [w.value for w in at.warning])


def walk_tabs(at: AppTest, prefix: str) -> None:
    for tab in TABS:
        at.session_state[f"{prefix}_attached_tabs"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])


def lookup(at: AppTest, prefix: str, prompt: str) -> list[dict]:
    at.session_state[f"{prefix}_attached_tabs"] = "Prompt lookup"
    at.run()
    at.text_area(key=f"{prefix}_prompt").set_value(prompt)
    next(b for b in at.button if b.label == "Look up").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return next(d.value for d in at.dataframe if "why" in d.value.columns).to_dict("records")


def test_live_attach_renders_in_the_live_page_with_every_tab(env):
    at = AppTest.from_file(str(APP), default_timeout=60)
    at = rerun_until(at, lambda a: "**Pod pod-a**" in texts(a) and "**Pod pod-b**" in texts(a),
                     what="the attached live view")
    assert at.title[0].value == "Live: an attached deployment's prefix cache"
    assert "no block grid, no block tables and no fragmentation view" in texts(at)
    assert [m.value for m in at.metric if m.label == "cached blocks"] == ["7", "5"]  # pod-a, pod-b
    assert [m.value for m in at.metric if m.label == "stored · removed"] == ["8 · 1", "5 · 0"]
    assert "Pod **pod-b** has a hole in its stream" in texts(at)
    assert not any(b.key == "live_reset" for b in at.button)  # nothing to reset on a watched pod
    walk_tabs(at, "live")
    rows = lookup(at, "live", SYSTEM + " what is a page")
    by_pod = {r["pod"]: r for r in rows}
    assert by_pod["pod-a"]["cached blocks"] == 4 and by_pod["pod-a"]["hit if sent now"] == 12
    assert by_pod["pod-b"]["cached blocks"] == 3 and by_pod["pod-b"]["matched by"] == "token ids"
    # the locator's why: pod-a holds every block; pod-b caches "what is a cache" / "... hash"
    assert (by_pod["pod-a"]["why"], by_pod["pod-a"]["tier"]) == ("whole prompt cached", "GPU")
    assert (by_pod["pod-b"]["why"], by_pod["pod-b"]["chain breaks at block"], by_pod["pod-b"]["at token"]) \
        == ("diverged", 3, 15)
    assert (by_pod["pod-a"]["missed tokens by cause"], by_pod["pod-b"]["missed tokens by cause"]) \
        == ("last token 4", "diverged 4")
    assert at.selectbox(key="live_locate_pod").value == "pod-a"  # its tree, the prefix outlined
    assert "`kvscope attach` answered at its step" in texts(at)  # live: POST /locate
    # the fidelity monitor: pod-b lost one batch in a hole; pod-a is complete
    at.session_state["live_attached_tabs"] = "Index fidelity"
    at.run()
    fid = {r["pod"]: r for r in at.dataframe[0].value.to_dict("records")}
    assert (fid["pod-a"]["completeness"], fid["pod-a"]["batches"], fid["pod-a"]["batches lost"]) == ("100.0%", 7, 0)
    assert (fid["pod-b"]["completeness"], fid["pod-b"]["gaps unfilled"], fid["pod-b"]["batches lost"]) == ("75.0%", 1, 1)
    assert fid["pod-b"]["dialects"] == "events array · hashes int · 3 frames · fields vllm-0.3x ×3"
    assert "Index fidelity: completeness 75.0% · 0 gap(s) filled, 1 not" in texts(at)
    # the wire doctor: pod-b's raw batches from the running attach, newest first
    at.session_state["live_attached_tabs"] = "Wire doctor"
    at.run()
    at.selectbox(key="live_wire_pod").set_value("pod-b").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.expander[0].label.startswith("seq 3 · segment 0 · live · ")
    fields = {r["path"]: r["value"] for r in at.dataframe[0].value.to_dict("records")}
    assert fields["events[0].type"] == "BlockStored" and fields["events[0].parent_block_hash"] == "13"
    at.session_state["live_attached_tabs"] = "Shared prefixes"
    at.run()
    shared = at.dataframe[0].value
    top = shared.iloc[0]
    assert (top["pod"], top["tokens"], top["continuations"]) == ("pod-a", 12, 3)
    assert top["prefix"] == SYSTEM
    at.switch_page("views/submit.py").run()
    assert "only listens" in texts(at)
    at.switch_page("views/attached.py").run()
    assert not at.exception and "**Pod pod-a**" in texts(at)


def test_a_stored_attached_run_replays_with_the_slider_and_every_tab(env):
    env.stop()
    run = RunStore(env.options.db).list_runs()[0]
    assert run["kind"] == "attached"
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/replay.py").run()
    at.selectbox(key="replay_run").set_value(run["id"]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(m.label == "cached blocks" for m in at.metric)  # the first pod heard from
    assert "has a hole" not in texts(at)  # the first step: nothing lost yet
    at.button(key="replay_jump_removal").click().run()
    at.button(key="replay_jump_hole").click().run()
    assert not at.exception
    assert "Pod **pod-b** has a hole in its stream" in texts(at)
    walk_tabs(at, "replay")
    # a stored run: the locator folds the recorded steps up to the shown one
    by_pod = {r["pod"]: r for r in lookup(at, "replay", SYSTEM + " what is a page")}
    assert (by_pod["pod-a"]["why"], by_pod["pod-a"]["hit if sent now"]) == ("whole prompt cached", 12)
    assert (by_pod["pod-b"]["why"], by_pod["pod-b"]["at token"]) == ("diverged", 15)
    assert "answered at its step" not in texts(at)
    assert at.slider(key="replay_slider").max == run["num_steps"] - 1
    at.switch_page("views/compare.py").run()  # attached runs are not offered to Compare
    assert not at.exception
    at.switch_page("views/attached.py").run()
    assert not at.exception and "**Pod pod-a**" in texts(at) and "**Pod pod-b**" in texts(at)


def test_the_event_log_says_what_a_stored_or_removed_block_is_and_where():
    from dashboard.event_log import _detail
    from engine.events.schema.types import KVBlockRemoved, KVBlockStored

    full = KVBlockStored(1, "p", ("ab" * 8,), None, (1, 2), 2, 1.0, "GPU", group_idx=0,
                         kv_cache_spec_kind="full_attention")
    assert _detail(full)[1] == "pod p; 1 x 2 tokens after the root; GPU, group 0, full_attention"
    placeholder = KVBlockStored(1, "p", ("cd" * 8,), None, (), 0, 1.0, "CPU_PINNED", locality="LOCAL",
                                ownership="tier-1")
    assert _detail(placeholder)[1] == "pod p; a placeholder (hash only, no tokens); CPU_PINNED, LOCAL, tier-1"
    assert _detail(KVBlockRemoved(2, "p", ("ab" * 8,), 2.0))[1] == "pod p"


def fleet_table(at: AppTest) -> dict[str, dict]:
    assert not at.exception, [e.value for e in at.exception]
    return {r["pod"]: r for r in at.dataframe[0].value.to_dict("records")}


def test_the_fleet_page_has_a_row_per_pod_live_and_stored(env):
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/fleet.py")
    at = rerun_until(at, lambda a: len(a.dataframe) > 0 and len(a.dataframe[0].value) == 2,
                     what="the fleet table")
    assert at.title[0].value == "Fleet: every pod at a glance"
    rows = fleet_table(at)
    assert list(rows) == ["pod-a", "pod-b"]
    a, b = rows["pod-a"], rows["pod-b"]
    assert (a["cached blocks"], a["index completeness"], a["gaps unfilled"], a["look at"]) == (7, "100.0%", 0, "–")
    assert (b["cached blocks"], b["index completeness"], b["gaps unfilled"]) == (5, "75.0%", 1)
    assert b["look at"] == "1 batch(es) lost in 1 hole(s)"
    assert a["evicted before reuse"] == "100.0%"  # block 4 went, never reused
    assert a["hit rate"] == "–"  # no --metrics in the demo
    assert a["dialect"] == "events map · hashes int · 3 frames · fields common"
    assert a["last event"].endswith(" s")
    # achieved against reachable: pod-a's 4 requests (a start, 3 branches below the system
    # prompt) held 9 of 15 blocks; pod-b's 2 held 3 of 7; no pod held more than the one used
    assert (a["hit (events)"], a["reachable (events)"], b["hit (events)"]) == ("60.0%", "60.0%", "42.9%")
    assert ("Of the 22 prompt blocks of the 6 requests seen starting or branching, the pods they "
            "went to held 12 (54.5%)") in texts(at)
    assert any("**pod-b**: 1 batch(es) lost" in w.value for w in at.warning)
    # each routing policy over the same 6 requests: the prefix scorers and the oracle keep
    # pod-a's branches where the system prompt is (12 of 22), round-robin alternates (6)
    pol = {r["policy"]: r for r in at.dataframe[1].value.to_dict("records")}
    assert list(pol)[:2] == ["achieved (the pods used)", "reachable (best placement)"]
    assert {n: pol[n]["hit blocks"] for n in ("achieved (the pods used)", "reachable (best placement)",
                                              "precise-prefix", "oracle", "round-robin")} == {
        "achieved (the pods used)": 12, "reachable (best placement)": 12, "precise-prefix": 12,
        "oracle": 12, "round-robin": 6}
    assert (pol["oracle"]["hit rate"], pol["round-robin"]["requests per pod"]) == ("54.5%", "3 · 3")
    # the miss explainer: pod-a's first request cold (3 blocks), its 3 branches diverged
    miss = {r["pod"]: r for r in at.dataframe[2].value.to_dict("records")}
    assert (miss["pod-a"]["missed (events)"], miss["pod-a"]["causes (events)"]) == (24, "never_stored 12 · diverged 12")
    assert (miss["pod-a"]["cold (events)"], miss["pod-a"]["partial (events)"], miss["pod-a"]["cold (engine)"]) == (12, 12, "–")
    assert (miss["pod-b"]["missed (events)"], miss["pod-b"]["causes (events)"]) == (16, "never_stored 12 · diverged 4")
    env.stop()  # the stored run shows the same rows at its last step
    release_streamlit_resources()  # the dashboard's connection to the stopped attach
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/fleet.py").run()
    rows = fleet_table(at)
    assert (rows["pod-a"]["cached blocks"], rows["pod-b"]["index completeness"]) == (7, "75.0%")
    assert "a stored run" in "\n".join(c.value for c in at.caption)
