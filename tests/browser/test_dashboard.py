"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright (no browser download),
against a real uvicorn server on the test Postgres, with imported results and one experiment whose runs
change status while the page is open. Screenshots go to artifacts/ (kept as test artifacts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from core.settings import Settings
from db.runs import claim_run, mark_failed, record_result
from db.session import session_scope
from tests.api.test_analysis import TPS, _result
from tests.api.test_import import _point
from tests.clusters import networked_cluster_toml
from tests.db.helpers import add_experiment
from tests.live_server import live_server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
POLL_MS = 400


@pytest.fixture
def server(test_settings: Settings, api_token: str) -> Iterator[str]:
    with live_server(test_settings) as url:
        yield url


@pytest.fixture
def browser_page():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium (scripts/test-deps.sh installs it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page, errors
        browser.close()


def _live_experiment(factory) -> tuple[int, dict[tuple[str, int], int]]:
    """debug model, bf16 + fp8-tensorwise at N = 1, 2, 4: four succeeded, bf16 N=4 failed, fp8 N=4 queued."""
    with session_scope(factory) as s:
        exp_id, _ = add_experiment(s, name="live fp8 scaling")
        rows = s.execute(
            sa.text("SELECT id, run_key, precision, num_devices FROM runs WHERE experiment_id = :e"), {"e": exp_id}
        ).all()
        ids = {}
        for run_id, key, precision, n in rows:
            ids[(precision, n)] = run_id
            if n == 4 and precision != "bf16":
                continue
            claim_run(s, run_id, "worker-1", "host", 60)
            if n == 4:
                mark_failed(s, run_id, "oom", "CUDA out of memory (tried to allocate 2.00 GiB)")
            else:
                offset = 0.02 if precision != "bf16" else 0.0  # fp8 a little above bf16: two visible curves
                record_result(s, run_id, _result(key, TPS[(precision, n)], n, num_steps=50, loss_offset=offset))
    return exp_id, ids


def _import_published(base: str, token: str) -> list[int]:
    out = []
    for name, techniques, compile in (
        ("torchtitan FSDP eager (H100)", [("eager", "bf16")], False),
        ("torchtitan FSDP compile + Float8 (H100)", [("compile", "bf16"), ("float8", "fp8-tensorwise")], True),
    ):
        body = {
            "name": name,
            "model": "8b",
            "cluster": "grand-teton-h100",
            "vendor": "nvidia",
            "device_name": "NVIDIA H100 (96GB HBM2e, 500W)",
            "scaling": "weak",
            "seq_len": 8192,
            "local_batch_size": 2,
            "compile": compile,
            "points": [_point(t, n, p) for t, p in techniques for n in (8, 128)],
        }
        r = httpx.post(f"{base}/experiments/import", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        out.append(r.json()["id"])
    return out


def _attr(page, selector: str, name: str) -> str:
    return page.get_attribute(selector, name)


def test_dashboard_draws_points_and_follows_status_live(server, api_token, pg_session_factory, browser_page) -> None:
    page, errors = browser_page
    eager_id, compiled_id = _import_published(server, api_token)
    exp_id, run_ids = _live_experiment(pg_session_factory)
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{server}/?poll_ms={POLL_MS}#/")
    page.wait_for_selector(f"#experiments tr[data-id='{exp_id}']")
    assert page.locator("#experiments tbody tr").count() == 3

    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{exp_id}")
    page.wait_for_selector("#chart-throughput canvas")
    # bf16 and fp8 measured at N=1, 2; bf16 N=4 failed (a red cross), fp8 N=4 queued (nothing drawn yet)
    assert _attr(page, "#chart-throughput", "data-points") == "4"
    assert _attr(page, "#chart-throughput", "data-failed") == "1"
    assert _attr(page, "#chart-efficiency", "data-points") == "4"
    assert _attr(page, "#chart-speedup", "data-points") == "2"
    assert _attr(page, "#chart-memory", "data-points") == "4"
    assert _attr(page, "#chart-loss", "data-points") == "100"  # N=2: two curves of 50 steps
    fp8_run = f"#run-{run_ids[('fp8-tensorwise', 4)]}"
    assert _attr(page, fp8_run, "data-status") == "queued"
    legend = page.evaluate(
        "Chart.getChart(document.querySelector('#chart-throughput canvas')).data.datasets.map(d => d.label)"
    )
    assert "bf16 · fsdp" in legend and "fp8-tensorwise · fsdp" in legend and "failed run (no value)" in legend
    loss_legend = page.evaluate(
        "Chart.getChart(document.querySelector('#chart-loss canvas')).data.datasets.map(d => d.label)"
    )  # time to the same loss: the matched points of the fp8 curve against bf16's
    assert any(label.startswith("same loss fp8-tensorwise · fsdp") for label in loss_legend), loss_legend

    # the page keeps polling; unchanged answers are 304s and change nothing
    renders = page.evaluate("SB_STATS.renders")
    page.wait_for_function("SB_STATS.notModified >= 2", timeout=10_000)
    assert page.evaluate("SB_STATS.renders") == renders

    with session_scope(pg_session_factory) as s:
        assert claim_run(s, run_ids[("fp8-tensorwise", 4)], "worker-2", "host", 60)
    page.wait_for_selector(f"{fp8_run}[data-status='running']", timeout=10_000)
    with session_scope(pg_session_factory) as s:
        key = s.scalar(sa.text("SELECT run_key FROM runs WHERE id = :i"), {"i": run_ids[("fp8-tensorwise", 4)]})
        assert record_result(s, run_ids[("fp8-tensorwise", 4)], _result(key, 4680.0, 4, num_steps=50))
    page.wait_for_selector(f"{fp8_run}[data-status='succeeded']", timeout=10_000)
    page.wait_for_function("document.querySelector('#chart-throughput').dataset.points === '5'", timeout=10_000)
    assert page.locator("#head [data-status]").first.get_attribute("data-status") == "failed"  # all ended, one failed
    page.screenshot(path=str(ARTIFACTS / "dashboard-experiment.png"), full_page=True)

    page.goto(f"{server}/?poll_ms={POLL_MS}#/compare?ids={eager_id},{compiled_id}")
    page.wait_for_selector("#cmp-ratio canvas")
    assert _attr(page, "#cmp-ratio", "data-points") == "2"  # compiled bf16 / eager bf16 at N = 8, 128
    assert _attr(page, "#cmp-throughput", "data-points") == "6"
    assert page.locator("#ratios tbody tr").count() == 2
    page.screenshot(path=str(ARTIFACTS / "dashboard-compare.png"), full_page=True)

    # the imported torchtitan table projected past its 128 GPUs: a dashed line inside a shaded 80% band that
    # starts at the last measured point and widens with N
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{compiled_id}")
    page.wait_for_selector("#chart-efficiency[data-projected-bands='2']", timeout=15_000)
    assert int(_attr(page, "#chart-efficiency", "data-projected")) > 0
    assert _attr(page, "#chart-throughput", "data-projected-bands") == "2"  # bf16 and fp8-tensorwise
    # measured at 8 and 128: the projection is fitted to the 128 (the default), and the note says so
    assert "fitted to the measured points beyond N0" in page.inner_text("#projection-note")
    drawn = page.evaluate("""Chart.getChart(document.querySelector('#chart-efficiency canvas')).data.datasets
        .filter(d => d._projected).map(d => ({band: !!d._band, label: d.label, data: d.data.map(p => [p.x, p.y])}))""")
    assert len(drawn) == 6, drawn  # low edge, high edge and line for bf16 and fp8-tensorwise
    for low, high, line in (drawn[i : i + 3] for i in range(0, len(drawn), 3)):
        assert low["band"] and high["band"] and not line["band"] and "(projected)" in line["label"]
        assert low["data"][0] == high["data"][0] == line["data"][0]  # anchored at the last measured point
        assert low["data"][0][0] == 128
        widths = []
        for (x_lo, y_lo), (x_hi, y_hi), (x, y) in zip(low["data"], high["data"], line["data"], strict=True):
            assert x_lo == x_hi == x and y_lo <= y <= y_hi
            widths.append(y_hi - y_lo)
        assert widths[0] == 0 and all(b > a for a, b in zip(widths, widths[1:], strict=False))
    # the band's pixels: halfway between the line and the high edge, just left of the widest point, the canvas
    # is painted with the band drawn and changes when the band datasets are hidden
    shaded = page.evaluate("""() => {
        const chart = Chart.getChart(document.querySelector('#chart-efficiency canvas'));
        const ds = chart.data.datasets, idx = ds.map((d, i) => i).filter(i => ds[i]._projected);
        const [high, line] = [chart.getDatasetMeta(idx[1]).data, chart.getDatasetMeta(idx[2]).data];
        const k = high.length - 1, x = Math.round(high[k].x - 3), y = Math.round((high[k].y + line[k].y) / 2);
        const dpr = chart.currentDevicePixelRatio, ctx = chart.ctx;
        const pixel = () => Array.from(ctx.getImageData(x * dpr, y * dpr, 1, 1).data);
        const withBand = pixel();
        idx.filter(i => ds[i]._band).forEach(i => chart.setDatasetVisibility(i, false));
        chart.update('none');
        const withoutBand = pixel();
        idx.filter(i => ds[i]._band).forEach(i => chart.setDatasetVisibility(i, true));
        chart.update('none');
        return {withBand, withoutBand, gap: high[k].y - line[k].y};
    }""")
    assert shaded["gap"] < -4, shaded  # the high edge lies a few pixels above the line (y grows downwards)
    assert shaded["withBand"][3] > 0 and shaded["withBand"] != shaded["withoutBand"], shaded
    legend = page.evaluate(
        "Chart.getChart(document.querySelector('#chart-efficiency canvas')).legend.legendItems.map(i => i.text)"
    )
    assert not any("80% interval" in text for text in legend)  # the bands stay out of the legend
    page.locator("#chart-efficiency").screenshot(path=str(ARTIFACTS / "dashboard-projection-band.png"))
    assert not errors, errors


def test_loss_chart_shows_the_seed_spread(server, api_token, browser_page) -> None:
    """An import of bf16 and fp8 with 3 seeds each: the loss chart draws, per precision, the mean of the seeds
    and a shaded band from their min to their max (kept out of the legend)."""
    page, errors = browser_page
    points = [
        {
            "num_devices": 1,
            "precision": precision,
            "layout": "fsdp",
            "seed": seed,
            "tokens_per_sec": 1000.0,
            "loss_curve": [offset + 3.0 + 2.0 / (1 + s / 20) + 0.05 * seed for s in range(100)],
        }
        for precision, offset in (("bf16", 0.0), ("fp8-rowwise", 0.02))
        for seed in (0, 1, 2)
    ]
    body = {"name": "seed spread", "model": "debug", "cluster": "local-cpu", "seq_len": 256, "points": points}
    r = httpx.post(f"{server}/experiments/import", json=body, headers={"Authorization": f"Bearer {api_token}"})
    assert r.status_code == 201, r.text
    page.goto(f"{server}/?poll_ms={POLL_MS}#/experiments/{r.json()['id']}")
    page.wait_for_selector("#chart-loss[data-seed-bands='2']", timeout=15_000)
    assert _attr(page, "#chart-loss", "data-points") == "200"  # the two mean lines, 100 steps each
    drawn = page.evaluate("""Chart.getChart(document.querySelector('#chart-loss canvas')).data.datasets
        .filter(d => d._seedBand || d._count).map(d => ({band: !!d._band, label: d.label, y: d.data.map(p => p.y)}))""")
    low, high, mean = drawn[:3]
    assert low["band"] and high["band"] and not mean["band"] and "seeds 0, 1, 2" in mean["label"]
    assert (
        low["y"][0] == pytest.approx(5.0) and high["y"][0] == pytest.approx(5.1) and mean["y"][0] == pytest.approx(5.05)
    )
    legend = page.evaluate(
        "Chart.getChart(document.querySelector('#chart-loss canvas')).legend.legendItems.map(i => i.text)"
    )
    assert not any("seed range" in text for text in legend)
    assert len([t for t in legend if "mean of 3 runs" in t]) == 2 and any(t.startswith("window fp8") for t in legend)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#chart-loss").screenshot(path=str(ARTIFACTS / "dashboard-loss-seeds.png"))
    assert not errors, errors


H200_CLUSTERS_TOML = networked_cluster_toml("h200-ib", "NVIDIA H200", 128, "h200-hgx")


def test_fits_give_no_value_beyond_the_measured_range(test_settings, api_token, browser_page, tmp_path) -> None:
    """An imported H200 series, 8 -> 64 GPUs with E(64) = 96%, on a 1,024-GPU cluster: the fit line gives the fit
    parameters and no value at 1,024 (the note names the projection instead), while the projection is drawn to
    1,024 with its band: one prediction per point beyond the measured range."""
    page, errors = browser_page
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(H200_CLUSTERS_TOML)
    per_device = {8: 5000.0, 16: 4950.0, 32: 4875.0, 64: 4800.0}
    points = [
        {"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec_per_device": x}
        for n, x in per_device.items()
    ]
    body = {"name": "h200 8 to 64", "model": "8b", "cluster": "h200-ib", "scaling": "weak", "seq_len": 8192}
    with live_server(replace(test_settings, clusters_file=str(clusters))) as url:
        r = httpx.post(
            f"{url}/experiments/import",
            json={**body, "local_batch_size": 2, "points": points},
            headers={"Authorization": f"Bearer {api_token}"},
        )
        assert r.status_code == 201, r.text
        page.goto(f"{url}/?poll_ms={POLL_MS}#/experiments/{r.json()['id']}")
        page.wait_for_selector("#chart-efficiency[data-projected-bands='1']", timeout=15_000)
        fits = page.inner_text("#fits")
        assert "Amdahl s=" in fits and "USL σ=" in fits  # fitted: four measured points
        assert "N=1024 is outside the measured range 8..64" in fits and "80% interval" in fits
        assert "curve fit at" not in fits and "extrapolat" not in fits and "predicted" not in fits
        xs = page.evaluate("""Chart.getChart(document.querySelector('#chart-efficiency canvas')).data.datasets
            .filter(d => d._projected && !d._band).flatMap(d => d.data.map(p => p.x))""")
        assert max(xs) == 1024
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#fits").screenshot(path=str(ARTIFACTS / "dashboard-fits-beyond-range.png"))
    assert not errors, errors


def test_the_projection_names_the_stack_it_charged(test_settings, api_token, browser_page, tmp_path) -> None:
    """Two imports of one Megatron series on H200s: described by its experiment's `stacks`, the page names that
    stack under the charts; without a description it names the runner's stack and says the series was charged it."""
    page, errors = browser_page
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(H200_CLUSTERS_TOML)
    points = [
        {
            "num_devices": n,
            "precision": "bf16",
            "layout": "ddp",
            "engine": "command:megatron",
            "tokens_per_sec_per_device": x,
        }
        for n, x in {8: 5000.0, 16: 4950.0}.items()
    ]
    body = {"model": "8b", "cluster": "h200-ib", "seq_len": 8192, "local_batch_size": 2, "points": points}
    auth = {"Authorization": f"Bearer {api_token}"}
    with live_server(replace(test_settings, clusters_file=str(clusters))) as url:
        described = {"command:megatron": "distributed_optimizer=true,grad_reduce_bytes=2"}
        texts = {}
        for name, stacks in (("described", described), ("undescribed", {})):
            r = httpx.post(f"{url}/experiments/import", json={**body, "name": name, "stacks": stacks}, headers=auth)
            assert r.status_code == 201, r.text
            page.goto(f"{url}/?poll_ms={POLL_MS}#/experiments/{r.json()['id']}")
            page.wait_for_selector("#chart-efficiency[data-projected-bands='1']", timeout=15_000)
            texts[name] = page.inner_text("#projection-stacks")
            texts[f"{name} interval"] = page.inner_text("#projection-interval")
    assert texts["described"].startswith(
        "stack of command:megatron series: as the experiment's stacks describe it, distributed_optimizer=true, "
        "grad_reduce_bytes=2"
    )
    assert "measured on command:megatron" not in texts["described"]
    assert texts["undescribed"].startswith("stack of every series: the scalebench runner's (FSDP2")
    assert "measured on command:megatron, projected with the scalebench runner's collectives" in texts["undescribed"]
    # a ddp series: the family's few published points are named under the charts
    assert "published points of the layout family ddp" in texts["described interval"]
    assert not errors, errors
