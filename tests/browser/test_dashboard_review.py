"""Dashboard review fixes in a real browser (Debian Chromium + Playwright, against uvicorn on the test Postgres):
a permanent API error stops the polling and is shown in the page, the experiments list follows next_cursor, a long
name wraps, a refused projection is asked for once, an empty N select is hidden and E(N)'s 100% line spans the
projected range."""

from __future__ import annotations

import re

import httpx
import pytest
import sqlalchemy as sa

from db.session import session_scope
from tests.browser.test_dashboard import POLL_MS, _import_published, browser_page, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _import(base: str, token: str, name: str, **kw) -> int:
    body = {"name": name, "model": "debug", "cluster": "local-cpu", "seq_len": 256}
    body |= {
        "points": [
            {"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 900.0 * n} for n in (1, 2)
        ]
    }
    r = httpx.post(f"{base}/experiments/import", json=body | kw, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _requests_to(page, pattern: str) -> list[str]:
    urls: list[str] = []
    page.on("request", lambda req: urls.append(req.url) if re.search(pattern, req.url) else None)
    return urls


def _only_refusals(errors: list[str], statuses: set[int]) -> None:
    """The console errors are the browser's own lines for the refused requests, nothing else (no page error)."""
    for e in errors:
        status = re.search(r"status of (\d+)", e)
        assert status and int(status.group(1)) in statuses, errors


def test_a_permanent_error_stops_polling_and_shows_the_detail(server, browser_page) -> None:  # noqa: F811
    page, errors = browser_page
    asked = _requests_to(page, r"/experiments/999$")
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/999")
    page.wait_for_selector("#problem[data-status='404']", timeout=10_000)
    assert "experiment 999 does not exist" in page.inner_text("#problem")
    page.wait_for_timeout(5 * POLL_MS)
    assert len(asked) == 1, asked  # not asked again every POLL_MS
    assert page.inner_text("#live").startswith("stopped: 404")

    compared = _requests_to(page, r"/compare\?experiments=1,2$")
    page.goto(f"{server}/?poll_ms={POLL_MS}#/compare?ids=1,2")  # an empty database: 422
    page.wait_for_selector("#cmp-body #problem[data-status='422']", timeout=10_000)
    detail = page.inner_text("#problem")
    assert "422" in detail and "experiment" in detail.lower(), detail
    page.wait_for_timeout(5 * POLL_MS)
    assert len(compared) == 1, compared
    assert page.locator("#ids").input_value() == "1,2"  # the ids stay editable above the problem
    _only_refusals(errors, {404, 422})


def test_the_list_follows_next_cursor(server, api_token, browser_page) -> None:  # noqa: F811
    page, errors = browser_page
    ids = [_import(server, api_token, f"exp {i}") for i in range(5)]
    page.goto(f"{server}/?poll_ms={POLL_MS}&page_size=2#/")
    rows = page.locator("#experiments tbody tr[data-id]")
    page.wait_for_function("document.querySelectorAll('#experiments tbody tr[data-id]').length === 2")
    assert page.is_visible("#more")
    page.click("#more")
    page.wait_for_function("document.querySelectorAll('#experiments tbody tr[data-id]').length === 4")
    page.click("#more")
    page.wait_for_function("document.querySelectorAll('#experiments tbody tr[data-id]').length === 5")
    assert not page.is_visible("#more")  # the last page: no next_cursor
    shown = [int(rows.nth(i).get_attribute("data-id")) for i in range(5)]
    assert shown == sorted(ids, reverse=True)
    # a new experiment while the pages are open: every page is polled from the cursor before it, none lost
    newest = _import(server, api_token, "exp 5")
    page.wait_for_function("document.querySelectorAll('#experiments tbody tr[data-id]').length === 6", timeout=10_000)
    shown = [int(rows.nth(i).get_attribute("data-id")) for i in range(6)]
    assert shown == sorted([*ids, newest], reverse=True)
    assert page.locator("#more").is_hidden()  # 6 experiments on 3 pages of 2: no next_cursor
    assert not errors, errors


def test_a_long_name_wraps(server, api_token, browser_page) -> None:  # noqa: F811
    page, errors = browser_page
    exp_id = _import(server, api_token, "x" * 200)
    page.goto(f"{server}/?poll_ms={POLL_MS}#/")
    page.wait_for_selector(f"#experiments tr[data-id='{exp_id}']")
    overflow = "(el) => el.scrollWidth - el.clientWidth"
    assert page.eval_on_selector(".tablewrap", overflow) <= 0  # the columns stay in the table's box
    assert page.eval_on_selector("#experiments", "el => el.getBoundingClientRect().right") <= 1500
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{exp_id}")
    page.wait_for_selector("#head h1 .badge")
    assert page.eval_on_selector("#head h1", overflow) <= 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 1500
    assert not errors, errors


def test_a_refused_projection_is_asked_once(server, api_token, pg_session_factory, browser_page) -> None:  # noqa: F811
    """An import onto a new cluster whose device implies no network: /projection answers 422; the page asks once,
    shows the API's reason, and does not ask again when the experiment changes. No loss curve: no N select."""
    page, errors = browser_page
    exp_id = _import(server, api_token, "lab import", cluster="my-lab", vendor="nvidia", device_name="Acme Z1")
    asked = _requests_to(page, rf"/experiments/{exp_id}/projection$")
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{exp_id}")
    page.wait_for_function("(document.getElementById('projection-note') || {}).innerText?.includes('Projection: none')")
    assert "describes no network" in page.inner_text("#projection-note")
    assert page.locator("#loss-n-label").is_hidden()
    for i in range(2):  # the experiment changes: the page renders again
        with session_scope(pg_session_factory) as s:
            s.execute(sa.text("UPDATE experiments SET name = :n WHERE id = :i"), {"n": f"renamed {i}", "i": exp_id})
            # the experiment's ETag follows its runs (db.points.fingerprints): move their finished_at
            s.execute(
                sa.text(
                    "UPDATE runs SET finished_at = coalesce(finished_at, now()) + interval '1 second' "
                    "WHERE experiment_id = :i"
                ),
                {"i": exp_id},
            )
        page.wait_for_function(f"document.querySelector('#head h1').innerText.startsWith('renamed {i}')")
    assert "describes no network" in page.inner_text("#projection-note")
    assert len(asked) == 1, asked
    _only_refusals(errors, {422})


def test_the_100_percent_line_spans_the_projection(server, api_token, browser_page) -> None:  # noqa: F811
    page, errors = browser_page
    _, compiled_id = _import_published(server, api_token)
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{compiled_id}")
    page.wait_for_selector("#chart-efficiency[data-projected-bands='2']", timeout=15_000)
    xs = page.evaluate("""(() => { const c = Chart.getChart(document.querySelector('#chart-efficiency canvas'));
        const ds = c.data.datasets;
        return { ref: ds.filter(d => d._ref).flatMap(d => d.data.map(p => p.x)),
                 projected: ds.filter(d => d._projected).flatMap(d => d.data.map(p => p.x)),
                 max: c.scales.x.max }; })()""")
    assert max(xs["projected"]) > 128  # measured up to 128, projected beyond
    assert max(xs["ref"]) >= xs["max"] and min(xs["ref"]) <= 8 / 1.3 + 1e-9, xs
    assert page.locator("#loss-n-label").is_hidden()  # an import without loss curves
    assert not errors, errors
