"""The Attached view in real Chromium (Playwright): live on a running ``kvscope attach``
over two synthetic pods (the prefix locator's answer, then the Fleet page), then the stored
run in Replay and on the Attached page. Screenshots go to test-artifacts/dashboard/attached-*.png and fleet*.png
(with KVSCOPE_UPDATE_SCREENSHOTS=1 fleet.png is copied to docs/screenshots for the README)."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.attach.demo import publish_demo, word_tokenizer
from tests.attach.fake_publisher import FakePublisher
from tests.attach.helpers import source, start_attach, wait_until
from tests.dashboard.test_browser import (
    ARTIFACTS, CHROMIUM, DOCS, DOCS_MODE, VIEWPORT, Dashboard, _nav, _need_chromium, _shot,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(tmp_path):
    _need_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    a, b = FakePublisher(), FakePublisher(encoding="array", replay_layout=2)
    srv = start_attach(tmp_path, source(a, "pod-a"), source(b, "pod-b"),
                       tokenizer_file=word_tokenizer(tmp_path), label="demo deployment")
    try:
        a.wait_subscriber()
        b.wait_subscriber()
        publish_demo(a, b)
        wait_until(lambda: len(srv.worker.state.cached("pod-a")) == 7, what="the demo")
        dash = Dashboard({"KVSCOPE_URL": srv.url, "KVSCOPE_DB": srv.options.db,
                          "KVSCOPE_AUTOSTART": "0"}, ARTIFACTS / "streamlit-attached.log")
    except BaseException:
        srv.stop()
        a.close()
        b.close()
        raise
    yield srv, dash
    dash.stop()
    srv.stop()
    a.close()
    b.close()


def test_attached_view_in_chromium_live_and_stored(stack):
    from playwright.sync_api import expect, sync_playwright

    srv, dash = stack
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(60_000)
        try:
            page.goto(dash.url)
            expect(page.get_by_text("Live: an attached deployment's prefix cache")).to_be_visible(
                timeout=90_000)
            expect(page.get_by_text(re.compile("no block grid, no block tables"))).to_be_visible()
            expect(page.get_by_text(re.compile(r"^Pod pod-a · blocks of 4 tokens"))).to_be_visible()
            expect(page.get_by_text(re.compile(r"Pod pod-b has a hole in its stream"))).to_be_visible()
            tree = page.locator(".js-plotly-plot").first  # the prefix tree, drawn by plotly
            tree.wait_for()
            expect(page.get_by_text(re.compile(r"cached blocks in \d+ root\(s\): \d+ start a prompt"))).to_be_visible()
            page.get_by_text("Pause updates").first.click()
            _shot(page, "attached-live")
            tree.evaluate("e => e.scrollIntoView({block: 'center'})")
            _shot(page, "attached-tree")
            page.get_by_role("tab", name="Shared prefixes").click()
            expect(page.get_by_text("tokens shared").first).to_be_visible()
            page.get_by_role("tab", name="Prompt lookup").click()
            page.get_by_role("textbox", name="Prompt", exact=True).fill("you are a helpful assistant who answers in one short "
                                             "line . what is a page")
            page.get_by_role("button", name="Look up").click()
            expect(page.get_by_text(re.compile("Cached on pod-a"))).to_be_visible()
            # the locator's why, per pod: pod-b caches other questions after the system prompt
            expect(page.get_by_text(re.compile(r"the closest \(\w+\) differs from prompt token 15"))).to_be_visible()
            page.get_by_text(re.compile("Cached on pod-a")).scroll_into_view_if_needed()
            _shot(page, "attached-lookup")

            _nav(page, "Fleet")  # the fleet page: a row per pod, what to look at
            expect(page.get_by_text("Fleet: every pod at a glance")).to_be_visible()
            expect(page.get_by_text(re.compile(r"^2 pod\(s\) · 12 cached blocks in all"))).to_be_visible()
            expect(page.get_by_text(re.compile(r"1 batch\(es\) lost in 1 hole\(s\)")).first).to_be_visible()
            page.locator("[data-testid='stDataFrame']").first.wait_for()
            page.get_by_text("Pause updates").first.click()
            _shot(page, "fleet")
            # each routing policy on the same requests, and why tokens missed, per pod
            heading = page.get_by_text("What would each routing policy have done?")
            heading.scroll_into_view_if_needed()
            expect(heading).to_be_visible()
            expect(page.get_by_text(re.compile(r"The 6 requests seen \(22 full prompt blocks\)"))).to_be_visible()
            expect(page.get_by_text("Hit rate of the requests seen, per routing policy (cumulative)")).to_be_visible()
            _shot(page, "fleet-policies")
            misses = page.get_by_text("Why did prompt tokens miss?")
            misses.scroll_into_view_if_needed()
            expect(misses).to_be_visible()
            _shot(page, "fleet-misses")
            _nav(page, "Attached")

            srv.stop()  # the run is finished and stored
            _nav(page, "Replay")
            expect(page.get_by_role("combobox", name="Run")).to_have_value(
                re.compile(r"^demo deployment · .* · attached to pod-a, pod-b · \d+ steps"),
                timeout=30_000)
            expect(page.get_by_text("cached blocks", exact=True).first).to_be_visible()
            page.get_by_role("button", name=re.compile("next hole")).click()
            expect(page.get_by_text(re.compile(r"Pod pod-b has a hole in its stream"))).to_be_visible()
            _shot(page, "attached-replay")
            _nav(page, "Attached")
            expect(page.get_by_text("Attached: a deployment's prefix cache")).to_be_visible()
            expect(page.get_by_text(re.compile(r"^Pod pod-b · blocks of 4 tokens"))).to_be_visible(
                timeout=30_000)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "attached-failure.png"))
            raise
        finally:
            browser.close()
    if DOCS_MODE:  # the README's attach section shows the fleet page
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(ARTIFACTS / "fleet.png", DOCS / "fleet.png")
