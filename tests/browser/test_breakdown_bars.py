"""The step-breakdown bars in a real browser (Debian Chromium, Playwright): every stacked segment the page
draws is the API's value for that series, N and category, and the bars sit beside the efficiency curve."""

from __future__ import annotations

import httpx
import pytest

from core.analysis.breakdown import PARTITION
from db.session import session_scope
from tests.api.test_breakdown import record_profiled
from tests.browser.test_dashboard import ARTIFACTS, POLL_MS, browser_page, server  # noqa: F401 - fixtures
from tests.db.helpers import add_experiment

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_stacked_bars_match_the_api(server, api_token, pg_session_factory, browser_page) -> None:  # noqa: F811
    page, errors = browser_page
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, name="profiled fp8 scaling", profile_steps=3, steps=10)
    record_profiled(pg_session_factory, exp_id, skip={("bf16", 4)})
    api = httpx.get(f"{server}/experiments/{exp_id}/breakdown", headers={"Authorization": f"Bearer {api_token}"})
    assert api.status_code == 200, api.text
    report = api.json()

    failed: list[tuple[int, str]] = []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{exp_id}")
    page.wait_for_selector("#chart-breakdown canvas")
    assert page.get_attribute("#chart-breakdown", "data-bars") == "5"  # bf16 at N=1, 2; fp8 at N=1, 2, 4
    drawn = page.evaluate("""() => Chart.getChart(document.querySelector('#chart-breakdown canvas')).data""")
    counts = [int(n) for n in drawn["labels"]]
    assert counts == [1, 2, 4]
    segments = {(d["stack"], d["label"]): d["data"] for d in drawn["datasets"]}
    labels = dict(page.evaluate("SBBreakdown.PARTS.map(([k, label]) => [k, label])"))
    assert list(labels) == list(PARTITION)  # the stacked parts are the ones that add up to a step
    checked = 0
    for s in report["series"]:
        by_n = {p["num_devices"]: p for p in s["points"]}
        for key in PARTITION:
            values = segments[(f"{s['precision']} · {s['layout']}", labels[key])]
            for n, value in zip(counts, values, strict=True):
                if n in by_n:
                    assert value == pytest.approx(by_n[n][key], rel=1e-9), (s["precision"], n, key)
                    checked += 1
                else:
                    assert value is None
    assert checked == 5 * len(PARTITION)
    # the bar's height is the step: its segments add up to the API's step_ms
    fp8 = {p["num_devices"]: p for p in report["series"][1]["points"]}
    top = sum(segments[("fp8-tensorwise · fsdp", labels[k])][2] for k in PARTITION)
    assert top == pytest.approx(fp8[4]["step_ms"], rel=0.02)
    # beside the efficiency curve: the card after it in the grid
    cards = page.evaluate("[...document.querySelectorAll('.grid .card .chart')].map(c => c.id)")
    assert cards.index("chart-breakdown") == cards.index("chart-efficiency") + 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-breakdown.png"), full_page=True)
    # no script error; no failed request of the breakdown (other panels' failed requests are their tests' concern)
    assert not [e for e in errors if not e.startswith("Failed to load resource")], errors
    assert not [u for _, u in failed if "breakdown" in u], failed
