"""docs/grafana/kvscope_attach_fleet.json against Debian's real Prometheus scraping a live
``kvscope attach`` over two synthetic pods: every panel's query answers with data, and the
churn and fidelity panels say what the pods did (evictions on pod-a, a hole on pod-b)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.attach.fake_publisher import FakePublisher, removed, stored
from tests.attach.helpers import source, start_attach, wait_until
from tests.server.test_prometheus import _need_prometheus, _query, _until, running_prometheus

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kvscope_attach_fleet.json"


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with Grafana's variables as a test would set them."""
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"].replace("$pod", ".*").replace("$__rate_interval", "1m"))
            for p in dash["panels"] for t in p["targets"]]


@pytest.fixture
def stack(tmp_path):
    _need_prometheus()
    a, b = FakePublisher(), FakePublisher(encoding="array", replay_layout=2)
    srv = start_attach(tmp_path, source(a, "pod-a"), source(b, "pod-b"))
    try:
        with running_prometheus(tmp_path, "kvscope-attach", srv.port) as (url, proc):
            yield srv, a, b, url, proc
    finally:
        srv.stop()
        a.close()
        b.close()


def test_every_panel_of_the_attach_dashboard_answers_from_a_real_prometheus(stack):
    import urllib.request

    srv, a, b, api, proc = stack
    a.wait_subscriber()
    b.wait_subscriber()
    _until("a first scrape", lambda: [r for r in _query(api, 'up{job="kvscope-attach"}')
                                      if r["value"][1] == "1"], proc=proc)
    b.publish([stored([100], None, [1, 2, 3, 4], 4)])
    b.publish([removed([100])], drop_live=True, drop_replay=True)  # a hole
    b.publish([stored([101], None, [5, 6, 7, 8], 4)])
    for i in range(8):  # a block stored and the previous one evicted, every half second
        a.publish([stored([i + 1], None, [i, i, i, i], 4)] + ([removed([i])] if i else []))
        time.sleep(0.5)
    req = urllib.request.Request(srv.url.replace("ws://", "http://") + "/locate",
                                 data=b'{"token_ids": [0, 0, 0, 0, 9]}', method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    wait_until(lambda: srv.worker.fleet.get("pod-a", {}).get("evicted_blocks") == 7, what="the evictions")

    def answered(promql: str):
        return lambda: _query(api, promql) or None

    for title, promql in queries():  # every panel has data
        _until(f"data for '{title}': {promql}", answered(promql), timeout=30, proc=proc)
    by_pod = lambda promql: {r["metric"]["pod"]: float(r["value"][1]) for r in _query(api, promql)}  # noqa: E731
    q = dict(queries())
    _until("pod-a's evictions in a scrape", lambda: by_pod(
        "kvscope_attach_evicted_blocks_total").get("pod-a") == 7, proc=proc)
    assert by_pod(q["Blocks evicted per minute"])["pod-a"] > 0
    assert by_pod(q["Share evicted before any reuse"])["pod-a"] == 1.0  # nothing was reused
    completeness = by_pod(q["Index completeness"])
    assert completeness["pod-a"] == 1.0 and completeness["pod-b"] == pytest.approx(2 / 3)
    assert by_pod("kvscope_attach_lost_batches_total") == {"pod-a": 0.0, "pod-b": 1.0}
    reachable = by_pod(q["Hit rate: achieved against reachable (from the events)"])  # its last target
    assert reachable["pod-a"] == 0.0  # each pod-a request started a prompt no pod held
    # each routing policy replayed on the requests seen: ten prompts no pod held, so no hit
    rates = {r["metric"]["policy"]: float(r["value"][1])
             for r in _query(api, q["Hit rate per routing policy (the requests seen, replayed)"])}
    assert rates == dict.fromkeys(("round-robin", "least-loaded", "precise-prefix", "approx-prefix",
                                   "dynamo", "oracle"), 0.0)
    causes = {(r["metric"]["pod"], r["metric"]["cause"]): float(r["value"][1])
              for r in _query(api, q["Missed prompt tokens by cause (the requests seen)"])}
    # pod-a: its first prompt cold, the seven after it diverged from the root it still held
    assert (causes[("pod-a", "never_stored")], causes[("pod-a", "diverged")]) == (4.0, 28.0)
    info = {r["metric"]["pod"]: r["metric"] for r in _query(api, q["Dialect per pod (latest batch)"])}
    assert (info["pod-a"]["events"], info["pod-b"]["events"], info["pod-b"]["frames"]) == ("map", "array", "3")
