"""The regressions page in a real browser (Debian Chromium + Playwright) against uvicorn on the test
Postgres: the list, one regression's history chart with the baseline band, the env diff cause first, and
acknowledge with a token. Screenshot: artifacts/regressions.png."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.browser.test_dashboard import ARTIFACTS, browser_page, server  # noqa: F401 (fixtures)
from tests.db.nights import ENV, T0, add_night, make_suite, noisy
from worker.nightly import evaluate_finished

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _seed(factory) -> None:
    base = noisy(seed=5)

    def values(night, spec):
        v = base(night, spec)
        if night >= 10 and spec.precision == "bf16" and spec.num_devices == 2:
            v["tps"] *= 0.85
            v["env"] = ENV | {"torch_version": "2.14.0.dev"}
        return v

    with factory() as s:
        suite = make_suite(s)
        for i in range(12):
            add_night(s, suite, i, values)
            evaluate_finished(factory, T0 + timedelta(days=i, hours=1))


def test_regressions_page(server, browser_page, pg_session_factory, api_token):  # noqa: F811
    _seed(pg_session_factory)
    page, errors = browser_page
    page.goto(f"{server}/")
    page.click("text=Regressions")
    page.wait_for_selector("#list tbody tr[data-id]")
    assert page.locator("#list tbody tr[data-id]").count() >= 1
    page.select_option("#f-metric", "tokens_per_sec")
    page.wait_for_function("document.querySelectorAll('#list tbody tr[data-id]').length === 1")
    page.click("#list tbody tr[data-id]")
    page.wait_for_selector("#hist canvas")
    assert "likely cause: torch_version" in page.inner_text(".cause")
    assert page.locator("tr.changed").first.inner_text().startswith("torch_version")
    assert page.evaluate("Chart.getChart(document.querySelector('#hist canvas')).data.labels.length") == 12
    page.fill("#token", api_token)
    page.dispatch_event("#token", "change")
    page.click("#ack")
    page.wait_for_selector("#ack[disabled]")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "regressions.png"), full_page=True)
    assert errors == []
