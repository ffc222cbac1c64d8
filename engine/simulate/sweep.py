"""``kvscope simulate --sweep``: one trace under every combination of some settings.

``--sweep num_kv_blocks=500,1000,2000 --sweep router=round-robin,precise-prefix`` runs the
product (here 6 simulations) and gives one row each: the settings, the hit rates (vLLM's,
reachable, the router's loss), evictions, preemptions and TTFT. ``capacity_figure`` draws
the capacity curve: hit rate against each pod's KV memory, a line per router (the
oracle's, dotted, is the reachable one), as a plotly figure.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
from typing import Any, Iterator

from engine.simulate.simulation import SharedPrompts, SimConfig, simulate

SWEEPABLE = {"num_kv_blocks": int, "block_size": int, "pods": int, "router": str,
             "max_num_seqs": int, "max_num_batched_tokens": int}


def parse_sweeps(items: list[str]) -> dict[str, list[Any]]:
    """``name=v1,v2,...`` items into {name: [values]} (an unknown name or value: ValueError)."""
    out: dict[str, list[Any]] = {}
    for item in items:
        name, _, values = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in SWEEPABLE or not values:
            raise ValueError(f"--sweep {item!r}: use NAME=V1,V2,... with NAME one of {', '.join(SWEEPABLE)}")
        try:
            out[name] = [SWEEPABLE[name](v) for v in values.split(",")]
        except ValueError:
            raise ValueError(f"--sweep {item!r}: {name} takes {SWEEPABLE[name].__name__} values") from None
    return out


def _with(cfg: SimConfig, name: str, value: Any) -> SimConfig:
    if name == "pods":
        return dataclasses.replace(cfg, num_pods=value)
    if name == "router":
        return dataclasses.replace(cfg, router=value)
    if name in ("num_kv_blocks", "block_size"):
        key = "num_blocks" if name == "num_kv_blocks" else name
        return dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, **{key: value}))
    return dataclasses.replace(cfg, sched=dataclasses.replace(cfg.sched, **{name: value}))


def run_sweep(trace, base: SimConfig, sweeps: dict[str, list[Any]], progress=None,
              workers: int = 1) -> list[dict[str, Any]]:
    """A row per combination, in the product's order. The runs read no miss causes (the
    rows have none), so none are classified (``SimConfig.miss_causes``), and they share
    each request's prompt tokens and hashes (``map_runs``). ``workers`` > 1: that many forked processes run them,
    the same rows (tests/simulate/test_cli.py)."""
    names = list(sweeps)
    combos = list(itertools.product(*(sweeps[n] for n in names)))
    cfgs = []
    for values in combos:
        cfg = dataclasses.replace(base, miss_causes=False)
        for n, v in zip(names, values):
            cfg = _with(cfg, n, v)
        cfgs.append(cfg)
    rows = []
    for values, row in zip(combos, map_runs(_row, trace, cfgs, workers)):
        row = {**dict(zip(names, values)), **row}
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _row(trace, cfg: SimConfig, shared: SharedPrompts) -> dict[str, Any]:
    from engine.simulate.report import summarize

    s = summarize(simulate(trace, cfg, shared=shared))
    return dict(pods=cfg.num_pods, router=cfg.router, num_kv_blocks=cfg.cache.num_blocks,
                block_size=cfg.cache.block_size,
                prefix_cache_hit_rate=s["prefix_cache_hit_rate"], reachable_hit_rate=s["reachable_hit_rate"],
                router_loss=s["router_loss"], num_blocks_evicted=s["num_blocks_evicted"],
                num_preemptions=s["num_preemptions"], ttft_p50_s=s["ttft_s"]["p50"],
                ttft_p99_s=s["ttft_s"]["p99"], num_steps=s["num_steps"])


_JOB: dict[str, Any] = {}  # what forked workers run: set before the fork, read in the child


def map_runs(fn, trace, cfgs: list[SimConfig], workers: int = 1) -> Iterator[Any]:
    """``fn(trace, cfg, shared)`` for each of ``cfgs``, yielded in their order: here, or in
    ``workers`` forked processes. ``shared``: the prompts' tokens and hashes
    (``SharedPrompts``), made once here before any run (and before the fork: no worker
    makes them again; they and the trace reach the workers by the fork, not pickled).
    The collector is frozen over them: never scanned again, nor copied on write in a
    worker. Each run is one core, so two workers use both of a 2-core box's cores;
    results come back pickled."""
    shared = SharedPrompts(trace).prepare(cfgs)
    _JOB.update(fn=fn, trace=trace, cfgs=cfgs, shared=shared)
    gc.collect()
    gc.freeze()
    try:
        if workers <= 1 or len(cfgs) <= 1:
            yield from map(_job, range(len(cfgs)))
        else:
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(min(workers, len(cfgs))) as pool:
                yield from pool.imap(_job, range(len(cfgs)))
    finally:
        gc.unfreeze()
        _JOB.clear()


def _job(i: int) -> Any:
    """One run, with the cycle collector off until the run is garbage and then one collection
    to free it: a run's objects are millions and in cycles (the pools' linked free queues),
    and a collector back on at the run's end walked them, still alive, first."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _JOB["fn"](_JOB["trace"], _JOB["cfgs"][i], _JOB["shared"])
    finally:
        gc.collect()
        if was:
            gc.enable()


def format_rows(rows: list[dict[str, Any]]) -> str:
    cols = ("pods", "router", "num_kv_blocks", "block_size", "prefix_cache_hit_rate", "reachable_hit_rate",
            "router_loss", "num_blocks_evicted", "num_preemptions", "ttft_p50_s")
    head = ("pods", "router", "blocks", "bs", "hit rate", "reachable", "loss", "evicted", "preempt", "TTFT p50")

    def cell(v: Any, c: str) -> str:
        if v is None:
            return "-"
        if c.endswith("rate") or c == "router_loss":
            return f"{100 * v:.1f}%"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    table = [head] + [tuple(cell(r[c], c) for c in cols) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
    return "\n".join("  ".join(t[i].rjust(widths[i]) for i in range(len(cols))) for t in table)


def capacity_figure(rows: list[dict[str, Any]], bytes_per_block: int | None = None):
    """Hit rate against each pod's KV memory (blocks, or MiB with ``bytes_per_block``),
    a line per router (the oracle's is what was reachable)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    scale = (bytes_per_block / 2**20) if bytes_per_block else 1
    top = 0.0
    for router in dict.fromkeys(r["router"] for r in rows):
        mine = sorted((r for r in rows if r["router"] == router), key=lambda r: r["num_kv_blocks"])
        y = [100 * (r["prefix_cache_hit_rate"] or 0) for r in mine]
        top = max([top] + y)
        fig.add_trace(go.Scatter(x=[r["num_kv_blocks"] * scale for r in mine], y=y,
                                 mode="lines+markers", name=router,
                                 line={"dash": "dot"} if router == "oracle" else None))
    pods = rows[0]["pods"] if rows else 1
    fig.update_layout(title=f"Prefix-cache hit rate against KV memory per pod ({pods} pods)",
                      xaxis_title="KV memory per pod (MiB)" if bytes_per_block else "KV blocks per pod",
                      yaxis_title="hit rate (%)", yaxis_range=[0, min(100, top * 1.15 + 1)],
                      template="plotly_white")
    return fig


def figure_png(fig, path: str, width: int = 900, height: int = 500) -> None:
    """Draw ``fig`` to a PNG in headless Chromium (playwright, with Debian's /usr/bin/chromium
    where it is, the browser the dashboard's tests use): no kaleido needed."""
    import os
    import tempfile

    from playwright.sync_api import sync_playwright

    html = os.path.join(tempfile.mkdtemp(), "figure.html")
    fig.update_layout(width=width, height=height)
    fig.write_html(html, include_plotlyjs=True, full_html=True)
    exe = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width + 40, "height": height + 40})
        page.goto(f"file://{html}")
        page.wait_for_selector(".main-svg")
        page.locator(".plotly-graph-div").screenshot(path=path)
        browser.close()
