"""The thread-policy A/B harness on the tiny model: workers really run their policy,
every unit is timed for every policy, and the load process ends by itself."""

from __future__ import annotations

import time

from bench import threads_ab


def test_workers_run_their_policies_and_every_unit(tiny_llama):
    res = threads_ab.run(["1t", "2t-passive"], ["none"], rounds=1, model=tiny_llama, progress=False)
    assert {p: v["torch_threads"] for p, v in res["policies"].items()} == {"1t": 1, "2t-passive": 2}
    assert res["policies"]["2t-passive"]["env"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    units = res["loads"]["none"]["units"]
    assert set(units) == set(threads_ab.UNITS)
    for unit, row in units.items():
        assert set(row) == {"1t", "2t-passive"}
        assert row["1t"]["ratio_vs_first"] == 1.0
        assert all(r["median_step_ms"] > 0 and len(r["round_medians_ms"]) == 1 for r in row.values())
    md = threads_ab.render(res)
    assert "| decode_1 |" in md and "OMP_WAIT_POLICY=PASSIVE" in md


def test_load_process_is_bounded():
    hog = threads_ab.start_load("busy", max_seconds=0.3)
    t = time.monotonic()
    assert hog.wait(timeout=20) == 0
    assert time.monotonic() - t < 20
    assert threads_ab.start_load("none", 1) is None


def test_the_governed_default_is_not_pinned_and_reports_its_counts(tiny_llama):
    res = threads_ab.run(["1t", "governed"], ["none"], rounds=1, model=tiny_llama, progress=False)
    assert res["policies"]["governed"]["env"] == {"GOMP_SPINCOUNT": "10000"}
    units = res["loads"]["none"]["units"]
    for row in units.values():
        assert row["1t"]["torch_threads_after"] == [1]
        assert len(row["governed"]["torch_threads_after"]) == 1
        assert 1 <= row["governed"]["torch_threads_after"][0] <= 2
    assert "governed (kvscope's default): " in threads_ab.render(res)
