"""The real thing in a real browser: server (tiny model) + `streamlit run dashboard` +
Chromium through Playwright.

Clicks a preset, waits until the Live grid shows the blocks it allocated and the output text
appears, restarts the engine with another block size, checks both runs are listed
in Replay and Compare, and saves a 1280×800 screenshot of every page under
test-artifacts/dashboard/ (KVSCOPE_UPDATE_SCREENSHOTS=1 also copies them to
docs/screenshots/ for the README).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dashboard.server_process import stop_process
from engine import envs
from tests.dashboard.conftest import ROOT, Server, free_port

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
DOCS = ROOT / "docs" / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}
pytestmark = pytest.mark.slow
# A pool big enough that the burst preset runs for a few seconds even on the tiny model.
# KVSCOPE_BROWSER_MODEL / KVSCOPE_BROWSER_SERVE_ARGS swap in e.g. the default model to
# take README screenshots with real text.
SERVE_ARGS = "--num-kv-blocks 512 --block-size 4 --max-model-len 512"
DOCS_MODE = envs.UPDATE_SCREENSHOTS.get()
ALLOCATED = r"^(in use \(ref 1\)|shared \(ref > 1\)|free but cached.*): [1-9]"
BURST = 8  # requests of the memory-pressure preset (max_num_seqs >= 8 here); its
# one-click restart first moves to a pool that fills in seconds (a new run)


def _need_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    msg = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs the browser test: {msg}")
    pytest.skip(msg)


class Dashboard:
    """`streamlit run dashboard` on a free port, headless."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "dashboard", "--server.headless", "true",
             "--server.port", str(self.port), "--server.address", "127.0.0.1",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=1) as r:
                    if r.read().strip() == b"ok":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"streamlit did not start; see {log}")
            time.sleep(0.3)

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self.log.close()


@pytest.fixture
def stack(request, tmp_path):
    _need_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    db = str(tmp_path / "runs.sqlite")
    model = envs.BROWSER_MODEL.get() or request.getfixturevalue("tiny_model")
    args = envs.BROWSER_SERVE_ARGS.get()
    yield from serve_and_dash(model, db, shlex.split(SERVE_ARGS) if args is None else list(args),
                              "streamlit.log")


def serve_and_dash(model: str, db: str, serve_args, log_name: str):
    """A server on ``model`` and a dashboard on it; yields (server, dashboard), then stops both."""
    server = Server(model, db, serve_args)
    try:
        dash = Dashboard({"KVSCOPE_URL": server.url, "KVSCOPE_DB": db,
                          "KVSCOPE_AUTOSTART": "0"}, ARTIFACTS / log_name)
    except BaseException:
        server.stop()
        raise
    yield server, dash
    dash.stop()
    server.stop()


def _shot(page, name: str) -> None:
    """Screenshot once nothing is greyed out (Streamlit fades elements while rerunning)."""
    page.mouse.move(1270, 790)  # no hover tooltips in the picture
    deadline = time.monotonic() + 15
    while page.locator("[data-stale='true']").count() and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _wait_finished(db: str, n: int, timeout_s: float = 600) -> None:
    """Wait until the newest recorded run has ``n`` finished requests."""
    from engine.store.runs import RunStore

    deadline = time.monotonic() + timeout_s
    while True:
        runs = RunStore(db).list_runs()
        if runs and runs[0]["num_requests"] >= n:
            return
        assert time.monotonic() < deadline, f"the run did not finish {n} requests: {runs[:1]}"
        time.sleep(0.5)


def _nav(page, title: str) -> None:
    page.locator("[data-testid='stSidebarNav']").get_by_text(title, exact=True).click()


def _run_preset(page, key: str = "memory_pressure") -> None:
    """Click a preset on the Submit page and wait for its toast (the click registered)."""
    from playwright.sync_api import expect

    if "submit" not in page.url:
        _nav(page, "Submit")
    button = page.locator(f".st-key-preset_{key} button")
    expect(button).to_be_enabled(timeout=60_000)
    button.click()
    expect(page.get_by_text(re.compile(r"submitting \d+ request"))).to_be_visible(timeout=30_000)


def _pool(page) -> dict[str, int]:
    """The grid legend's block counts by state (e.g. {"in use (ref 1)": 12, ...})."""
    out = {}
    for t in page.locator("text.legendtext").all_text_contents():
        m = re.match(r"(.+): (\d+)$", t.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _wait_pool(page, pred, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred(_pool(page)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {_pool(page)}"
        page.wait_for_timeout(300)


def _changed(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith("changed"))


def _busy(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith(("in use", "shared")))


def _grid_legend(page, pattern: str, timeout_ms: int = 90_000) -> None:
    """Wait until the pool grid's legend shows ``pattern`` (counts are in the legend)."""
    page.locator("text.legendtext").filter(has_text=re.compile(pattern)).first.wait_for(
        timeout=timeout_ms)


def test_dashboard_in_chromium(stack):
    from playwright.sync_api import expect, sync_playwright

    server, dash = stack
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run",
            # the Live tab keeps redrawing while the other tab is in front
            "--disable-background-timer-throttling", "--disable-renderer-backgrounding"])
        # Two tabs, as a user would work: Live stays open (its view must follow the
        # workload as it runs: a tiny model finishes a burst in seconds), the other
        # tab submits and visits the other pages.
        live = browser.new_page(viewport=VIEWPORT)
        page = browser.new_page(viewport=VIEWPORT)
        for tab in (live, page):
            tab.set_default_timeout(60_000)
        try:
            live.goto(dash.url)
            expect(live.get_by_text("blocks used")).to_be_visible(timeout=90_000)
            _grid_legend(live, r"free: \d+")
            page.goto(dash.url + "/submit")

            # a preset: a burst bigger than the pool (blocks in use, preemptions, evictions)
            _run_preset(page)
            live.bring_to_front()  # a background tab does not redraw its charts
            # Blocks the preset allocated: in use while it runs, cached once it is done (a
            # tiny model may finish the whole burst between two redraws).
            _grid_legend(live, ALLOCATED)
            if DOCS_MODE:  # README screenshots: wait for a busy pool
                _wait_pool(live, lambda c: _busy(c) * 2 > sum(c.values()) - _changed(c),
                           "half the pool in use")
            # pause (a control users have too): a still picture, nothing greyed mid-redraw
            live.get_by_text("Pause updates").click()
            _shot(live, "live")
            live.get_by_role("tab", name="Fragmentation").click()
            split = live.get_by_text(re.compile(r"Where the \d+ token slots go"))
            split.wait_for()
            split.evaluate("e => e.scrollIntoView({block: 'center'})")  # charts in view
            _shot(live, "live-fragmentation")
            live.get_by_role("tab", name="Block tables").click()
            live.get_by_text("Pause updates").click()  # follow the engine again
            page.bring_to_front()

            page.locator("[data-testid='stText']").filter(  # the outputs stream in
                has_text=re.compile(r"\S{3,}")).first.wait_for(timeout=90_000)
            _shot(page, "submit")
            _wait_finished(server.db, BURST)

            _nav(page, "Replay")
            first_run = _health(server)["run_id"]
            # the run is listed (and picked: newest first)
            expect(page.get_by_role("combobox", name="Run")).to_have_value(
                re.compile(re.escape(first_run)), timeout=30_000)  # a loaded box redraws slowly
            jump = page.get_by_role("button", name=re.compile("next preemption"))
            if jump.is_enabled():  # show a step where the pool ran out
                jump.click()
                page.wait_for_timeout(1500)
            _shot(page, "replay")

            # a second run: the same preset with bigger blocks, to compare
            _nav(page, "Engine")
            page.get_by_text("Restart with new settings").wait_for()
            _shot(page, "engine")
            page.locator("[data-testid='stSelectbox']").filter(has_text="block_size").click()
            new_bs = 16 if _health(server)["block_size"] < 16 else 8
            page.get_by_role("option", name=str(new_bs), exact=True).click()
            page.get_by_role("button", name="Restart engine").click()
            expect(page.get_by_text("started (previous run")).to_be_visible(timeout=90_000)
            expect(page.get_by_text(f"× {new_bs} slots")).to_be_visible(timeout=30_000)
            _run_preset(page)
            _wait_finished(server.db, BURST)

            _nav(page, "Compare")
            second_run = _health(server)["run_id"]
            expect(page.get_by_role("combobox", name="Run A")).to_have_value(
                re.compile(re.escape(first_run)), timeout=30_000)
            expect(page.get_by_role("combobox", name="Run B")).to_have_value(
                re.compile(re.escape(second_run)), timeout=30_000)
            page.get_by_text("What differs").wait_for()
            page.locator(".js-plotly-plot").nth(5).wait_for()
            _shot(page, "compare")
        except BaseException:
            for name, tab in (("failure-live", live), ("failure", page)):
                tab.screenshot(path=str(ARTIFACTS / f"{name}.png"))  # what the pages showed
            raise
        finally:
            browser.close()
    if DOCS_MODE:
        DOCS.mkdir(parents=True, exist_ok=True)
        for png in ARTIFACTS.glob("*.png"):
            shutil.copy(png, DOCS / png.name)


def _health(server: Server) -> dict:
    import json

    with urllib.request.urlopen(server.health_url, timeout=2) as r:
        return json.loads(r.read())
