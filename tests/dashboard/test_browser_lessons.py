"""Lessons 9 and 10 (issue 31's two lessons) on the Lessons page in real Chromium (Playwright):
pick one, page through its narrative, predict, run it on the real engine (the tiny model, in the
page's subprocess) and see the answers computed from the run, its charts and the pool it points
at. The screenshots go to test-artifacts/dashboard/lesson-9.png and lesson-10.png."""

from __future__ import annotations

import re
from contextlib import contextmanager

import pytest

from tests.dashboard.conftest import free_port
from tests.dashboard.test_browser import ARTIFACTS, CHROMIUM, VIEWPORT, Dashboard, _nav, _need_chromium, _shot

pytestmark = pytest.mark.slow


@pytest.fixture
def dash(tmp_path, tiny_model):
    _need_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # no engine server: the Lessons page runs its own engine, and the Live page is not visited
    d = Dashboard({"KVSCOPE_URL": f"ws://127.0.0.1:{free_port()}", "KVSCOPE_AUTOSTART": "0",
                   "KVSCOPE_DB": str(tmp_path / "runs.sqlite"), "KVSCOPE_LESSON_MODEL": tiny_model},
                  ARTIFACTS / "streamlit-lessons.log")
    yield d
    d.stop()


@contextmanager
def lesson_page(dash, number: int, first_page: str):
    """A Chromium page on the Lessons page, lesson ``number`` picked (its first page shows
    ``first_page``) and paged through to its questions."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(60_000)
        try:
            page.goto(dash.url + "/lessons")
            _open_lesson(page, number, first_page)
            yield page
        finally:
            browser.close()


def _open_lesson(page, number: int, first_page: str) -> None:
    from playwright.sync_api import expect

    from lessons import get_lesson

    lesson = get_lesson(number)
    _nav(page, "Lessons")
    page.get_by_text("Predict, run the real engine").wait_for(timeout=90_000)
    page.locator("[data-testid='stSelectbox']").filter(has_text="Lesson").click()
    page.get_by_role("option", name=f"{number}. {lesson.title}").click()
    expect(page.get_by_text(first_page)).to_be_visible()
    for i in range(len(lesson.sections)):
        page.get_by_role("button", name="Next").click()
        expect(page.get_by_text(re.compile(rf"page {i + 2} of "))).to_be_visible()


def test_lesson_9_in_chromium(dash):
    from playwright.sync_api import expect

    from lessons.l09_prefix_routing import PER_TENANT, SYSTEM_LEN, TENANTS

    with lesson_page(dash, 9, "One pod's cache is not the fleet's.") as page:
        page.get_by_role("button", name="Run the scenario on the real engine").click()
        expect(page.get_by_text("Look: what the run says")).to_be_visible(timeout=240_000)
        body = page.locator("[data-testid='stMain']")
        # every request after a tenant's first reuses its whole system prompt on its pod
        expect(body).to_contain_text(f"Computed from the run: {(PER_TENANT - 1) * len(TENANTS) * SYSTEM_LEN} "
                                     "(no prediction)")
        expect(body.get_by_text("Computed from the run:")).to_have_count(3)
        expect(body).to_contain_text("Takeaway.")
        expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=30_000)
        expect(page.locator("[data-testid='stDataFrame']").first).to_be_visible()
        _shot(page, "lesson-9")


def test_lesson_10_in_chromium(dash):
    from playwright.sync_api import expect

    with lesson_page(dash, 10, '"My hit rate is 0%."') as page:
        page.get_by_text("no: the shared prefix is shorter than a block").click()
        page.get_by_text("between 50% and 90%").click()
        page.get_by_role("button", name="Run the scenario on the real engine").click()
        expect(page.get_by_text("Look: what the run says")).to_be_visible(timeout=180_000)
        body = page.locator("[data-testid='stMain']")
        expect(body).to_contain_text("Computed from the run: no: the shared prefix is shorter "
                                     "than a block (right: you predicted it)")
        expect(body).to_contain_text("Computed from the run: 48 (no prediction)")
        expect(body).to_contain_text("Computed from the run: evicted: cached, then reused")
        expect(body).to_contain_text("Computed from the run: between 50% and 90% (right: you "
                                     "predicted it)")
        expect(body).to_contain_text("Takeaway.")
        # the bars, the usage lines and the pool grid (plotly), the two tables
        expect(page.locator(".js-plotly-plot")).to_have_count(3, timeout=30_000)
        expect(page.locator("[data-testid='stDataFrame']")).to_have_count(2)
        chart = page.locator(".js-plotly-plot").nth(1)
        expect(chart).to_contain_text("kv_token_usage (tokens)")
        chart.scroll_into_view_if_needed()
        _shot(page, "lesson-10")
