"""Debian's real Prometheus scrapes a live server and answers vLLM dashboard queries with data."""

from __future__ import annotations

import json
import math
import os
import contextlib
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from dashboard.server_process import stop_process
from engine.client import KVScopeClient
from tests.dashboard.conftest import free_port
from tests.server.helpers import GREEDY

PROMETHEUS = "/usr/bin/prometheus"  # Debian's `prometheus` package (.ci/run installs it)
MODEL = "kvscope-tiny"
SEL = f'model_name="{MODEL}", engine="0"'  # as vllm_kv_cache.json filters
QUERIES = {
    "hits": f"rate(vllm:prefix_cache_hits_total{{{SEL}}}[1m])",
    "ttft_p90": "histogram_quantile(0.9, sum by (le) "
                f"(rate(vllm:time_to_first_token_seconds_bucket{{{SEL}}}[1m])))",
    "usage": f"vllm:kv_cache_usage_perc{{{SEL}}}",
}


def _need_prometheus() -> None:
    if os.access(PROMETHEUS, os.X_OK):
        return
    msg = f"{PROMETHEUS} is missing (apt-get install -y prometheus)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs the Prometheus test: {msg}")
    pytest.skip(msg)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _query(api: str, promql: str) -> list[dict]:
    out = _get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert out["status"] == "success", out
    return out["data"]["result"]


def _until(what: str, check, timeout: float = 60.0, proc=None):
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode} while waiting for {what}")
        try:
            got = check()
        except (OSError, urllib.error.URLError, ValueError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout}s")
        time.sleep(0.5)


@contextlib.contextmanager
def running_prometheus(tmp_path, job: str, target_port: int):
    """A real Prometheus scraping ``127.0.0.1:target_port`` every second, as job ``job``;
    yields (its URL, its process) and stops it after."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: {job}\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def prometheus(tmp_path, make_server):
    """A kvscope server and a Prometheus scraping it every second; both stopped after."""
    _need_prometheus()
    server = make_server(served_model_name=MODEL)
    with running_prometheus(tmp_path, "kvscope", server.port) as (url, proc):
        yield server, url, proc


def test_prometheus_answers_dashboard_queries_with_data(prometheus):
    server, api, proc = prometheus
    up = _until("a first scrape", lambda: [r for r in _query(api, 'up{job="kvscope"}')
                                            if r["value"][1] == "1"], proc=proc)
    assert up[0]["metric"]["instance"] == f"127.0.0.1:{server.port}"
    with KVScopeClient(server.url, timeout=30) as c:
        for _ in range(3):  # the same prompt again and again: prefix-cache hits
            c.generate("the prompt that Prometheus will watch", params=GREEDY)

    def hits():
        r = _query(api, QUERIES["hits"])
        return r if r and float(r[0]["value"][1]) > 0 else None

    (series,) = _until("a prefix-cache hit rate", hits, proc=proc)
    assert series["metric"]["model_name"] == MODEL and series["metric"]["engine"] == "0"
    assert series["metric"]["job"] == "kvscope"

    def ttft():
        r = _query(api, QUERIES["ttft_p90"])
        return r if r and math.isfinite(float(r[0]["value"][1])) else None

    (p90,) = _until("a TTFT p90", ttft, proc=proc)
    assert 0 < float(p90["value"][1]) <= 2560  # inside vLLM's TTFT buckets
    def idle_usage():  # the scrapes that saw the hits may have been taken mid-request:
        r = _query(api, QUERIES["usage"])  # wait for one taken after the last finished
        return r if r and float(r[0]["value"][1]) == 0.0 else None

    # idle now: every block is free (cached ones too)
    (usage,) = _until("a scrape of the idle pool (0 KV cache usage)", idle_usage, proc=proc)
    assert usage["metric"]["instance"] == f"127.0.0.1:{server.port}"
