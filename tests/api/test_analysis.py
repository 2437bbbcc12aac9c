"""Scaling JSON/CSV/PNG, loss curves, compare and ETag polling, on the real Postgres with runs recorded the
way workers record them (db.runs.record_result)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import db.points
from core.contracts.specs import RunResult
from core.settings import Settings
from db.models import Experiment
from db.runs import claim_run, mark_failed, record_result
from db.session import session_scope
from tests.db.helpers import add_experiment


@pytest.fixture
def test_settings(test_settings: Settings) -> Settings:
    """These tests change runs and look at once; the fingerprint reuse window is tested on its own."""
    return dataclasses.replace(test_settings, etag_ttl_s=0.0)


# X(N) global tokens/s per (precision, N): bf16 scales at 90% to N=4, fp8 is 1.3x bf16
TPS = {
    ("bf16", 1): 1000.0,
    ("bf16", 2): 1900.0,
    ("bf16", 4): 3600.0,
    ("fp8-tensorwise", 1): 1300.0,
    ("fp8-tensorwise", 2): 2470.0,
    ("fp8-tensorwise", 4): 4680.0,
}


def _result(run_key: str, tps: float, n: int, num_steps: int = 10, loss_offset: float = 0.0) -> RunResult:
    steps = [
        {"step": i, "loss": 6.0 - 0.01 * i + loss_offset, "step_ms": 100.0, "tokens": 512} for i in range(num_steps)
    ]
    summary = dict(
        num_timed_steps=num_steps,
        tokens_per_step=512,
        tokens_per_sec=tps,
        tokens_per_sec_per_device=tps / n,
        step_ms_median=100.0,
        step_ms_min=99.0,
        step_ms_max=101.0,
        flops_per_token=1000,
        tflops_per_device=0.1,
        mfu_vs_bf16_peak=0.4,
        peak_memory_allocated_gib=1.5 * n,
    )
    return RunResult.model_validate(
        {
            "run_key": run_key,
            "status": "succeeded",
            "steps": steps,
            "summary": summary,
            "numerics": {"final_loss": steps[-1]["loss"]},
        }
    )


def _finish_all(factory: sessionmaker[Session], exp_id: int, fail_n: int | None = None, num_steps: int = 10) -> None:
    """Every run of the experiment succeeded with TPS, except the N=fail_n runs (failed, oom)."""
    with session_scope(factory) as s:
        rows = s.execute(
            sa.text("SELECT id, run_key, precision, num_devices FROM runs WHERE experiment_id = :e"), {"e": exp_id}
        ).all()
        for run_id, key, precision, n in rows:
            claim_run(s, run_id, "w", "h", 60)
            if n == fail_n:
                mark_failed(s, run_id, "oom", "out of memory")
            else:
                record_result(s, run_id, _result(key, TPS[(precision, n)], n, num_steps))


def test_scaling_json_csv_png_and_one_query(client, pg_session_factory, pg_engine) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_all(pg_session_factory, exp_id, fail_n=4)

    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    sa.event.listen(pg_engine, "before_cursor_execute", listener)
    try:
        with pg_session_factory() as s:
            points = db.points.load_run_points(s, exp_id)
    finally:
        sa.event.remove(pg_engine, "before_cursor_execute", listener)
    assert len(statements) == 1 and len(points) == 6
    assert {p.model for p in points} == {"debug"} and {p.num_layers for p in points} == {4}

    r = client.get(f"/experiments/{exp_id}/scaling")
    assert r.status_code == 200 and r.headers["etag"]
    rep = r.json()
    bf16 = next(s for s in rep["series"] if s["key"]["precision"] == "bf16")
    by_n = {p["num_devices"]: p for p in bf16["points"]}
    assert by_n[2]["efficiency"] == 0.95 and by_n[4]["status"] == "failed"
    assert by_n[2]["final_loss"] == 5.91 and by_n[2]["peak_memory_allocated_gib"] == 3.0
    assert {sp["num_devices"]: round(sp["speedup"], 6) for sp in rep["speedups"]} == {1: 1.3, 2: 1.3}
    assert not bf16["amdahl"]["fitted"]  # two measured points: fits refuse

    csv = client.get(f"/experiments/{exp_id}/scaling?format=csv")
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert lines[0].startswith("engine,model,num_layers,precision") and len(lines) == 1 + 6
    png = client.get(f"/experiments/{exp_id}/scaling.png")
    assert png.headers["content-type"] == "image/png" and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    bad = client.get(f"/experiments/{exp_id}/scaling?format=xml")
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.format"
    assert set(bad.json()["errors"][0]["allowed"]) == {"json", "csv"}
    assert client.get("/experiments/999/scaling").status_code == 404


def test_baseline_and_full_size(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_all(pg_session_factory, exp_id)
    rep = client.get(f"/experiments/{exp_id}/scaling?baseline_num_devices=2").json()
    unmeasured = client.get(f"/experiments/{exp_id}/scaling?baseline_num_devices=3")
    (error,) = unmeasured.json()["errors"]
    assert unmeasured.status_code == 422 and error["field"] == "query.baseline_num_devices"
    assert error["message"] == "N0=3 was not measured in any series" and error["allowed"] == [1, 2, 4]
    bf16 = next(s for s in rep["series"] if s["key"]["precision"] == "bf16")
    assert bf16["baseline_num_devices"] == 2
    assert {p["num_devices"]: round(p["efficiency"], 6) for p in bf16["points"]} == {
        1: round(1000 / 950, 6),
        2: 1.0,
        4: round(3600 / 3800, 6),
    }
    # default full size: local-cpu has 4 devices, within the measured range 1..4: the curve fit's value there
    for fit in (bf16["amdahl"], bf16["usl"]):
        assert fit["at_full_size"]["num_devices"] == 4
        assert fit["at_full_size"]["note"] == "curve fit at N=4, within the measured range 1..4"
    assert not any("projection" in n for n in bf16["notes"])


def test_no_fit_value_beyond_the_measured_range(client, pg_session_factory) -> None:
    """full_size=64 lies beyond the measured 1..4: the fits give no value there (no second prediction beside
    the projection's), the notes point to GET /projection, and the CSV holds the measured points only."""
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_all(pg_session_factory, exp_id)
    rep = client.get(f"/experiments/{exp_id}/scaling?full_size=64").json()
    assert len(rep["series"]) == 2
    for series in rep["series"]:
        for name in ("amdahl", "usl"):
            assert series[name]["fitted"] and series[name]["at_full_size"] is None
            assert "prediction" not in series[name] and "extrapolated" not in series[name]
        (note,) = [n for n in series["notes"] if "projection" in n]
        assert note.startswith("N=64 is outside the measured range 1..4: the Amdahl/USL fits describe")
        assert "E(N) with its 80% interval (GET /experiments/{id}/projection)" in note
        assert {p["num_devices"] for p in series["points"]} == {1, 2, 4}
    assert "extrapolat" not in json.dumps(rep["series"])  # (time to loss has its own, fp8's curve past its end)

    from core.analysis.scaling import CSV_COLUMNS

    csv = client.get(f"/experiments/{exp_id}/scaling?format=csv&full_size=64").text.strip().splitlines()
    assert csv[0] == ",".join(CSV_COLUMNS)
    assert not any(word in csv[0] for word in ("amdahl", "usl", "fit", "predict", "extrapol"))
    n_col = CSV_COLUMNS.index("num_devices")
    assert sorted(int(row.split(",")[n_col]) for row in csv[1:]) == [1, 1, 2, 2, 4, 4]

    params = {
        p["name"]: p
        for p in client.get("/openapi.json").json()["paths"]["/experiments/{experiment_id}/scaling"]["get"][
            "parameters"
        ]
    }
    described = params["full_size"]["description"]
    assert "within a series' measured range" in described and "GET /experiments/{id}/projection" in described


def _status_change(factory: sessionmaker[Session], exp_id: int) -> None:
    with session_scope(factory) as s:
        run_id = s.scalar(
            sa.text("SELECT min(id) FROM runs WHERE experiment_id = :e AND status = 'queued'"), {"e": exp_id}
        )
        assert claim_run(s, run_id, "w", "h", 60)


def test_etag_304_without_building_and_changes_with_status(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    paths = [
        f"/experiments/{exp_id}",
        f"/experiments/{exp_id}/runs",
        f"/experiments/{exp_id}/scaling",
        f"/experiments/{exp_id}/scaling?format=csv",
        f"/experiments/{exp_id}/losses",
    ]
    tags = {}
    for p in paths:
        r = client.get(p)
        assert r.status_code == 200 and r.headers["cache-control"] == "no-cache", p
        tags[p] = r.headers["etag"]
    assert len(set(tags.values())) == len(paths)  # the variant (path, query) is part of the tag

    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    app_engine = client.app.state.engine
    sa.event.listen(app_engine, "before_cursor_execute", listener)
    try:
        for p in paths:
            r = client.get(p, headers={"If-None-Match": tags[p]})
            assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == tags[p], p
    finally:
        sa.event.remove(app_engine, "before_cursor_execute", listener)
    assert len(statements) == len(paths)  # one fingerprint query per poll, no report built
    assert client.get(paths[0], headers={"If-None-Match": f'W/{tags[paths[0]]}, "other"'}).status_code == 304

    _status_change(pg_session_factory, exp_id)
    for p in paths:
        r = client.get(p, headers={"If-None-Match": tags[p]})
        assert r.status_code == 200 and r.headers["etag"] != tags[p], p
    assert client.get(f"/experiments/{exp_id}").json()["counts"]["running"] == 1


def test_experiment_list_etag(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    r = client.get("/experiments")
    assert client.get("/experiments", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    _status_change(pg_session_factory, exp_id)
    assert client.get("/experiments", headers={"If-None-Match": r.headers["etag"]}).status_code == 200


def test_fingerprint_ignores_heartbeats_and_sees_cancel_requests(pg_session_factory) -> None:
    from db.experiments import cancel_experiment
    from db.runs import heartbeat

    with session_scope(pg_session_factory) as s:
        exp_id, run_ids = add_experiment(s)
        claim_run(s, run_ids[0], "w", "h", 60)
    with pg_session_factory() as s:
        before = db.points.fingerprint(s, exp_id)
    with session_scope(pg_session_factory) as s:
        heartbeat(s, run_ids[0], 60)
    with pg_session_factory() as s:
        assert db.points.fingerprint(s, exp_id) == before
        assert db.points.fingerprint(s, 999) is None
    with session_scope(pg_session_factory) as s:
        cancel_experiment(s, exp_id)
    with pg_session_factory() as s:
        assert db.points.fingerprint(s, exp_id) != before


def test_loss_curves_thinned_in_sql(pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, repeats=2)
    _finish_all(pg_session_factory, exp_id, num_steps=1001)
    with pg_session_factory() as s:
        curves = db.points.loss_curves(s, exp_id)
        small = db.points.loss_curves(s, exp_id, max_points=7, num_devices=1)
        firsts = db.points.loss_curves(s, exp_id, every_repeat=False)
    assert len(firsts) == 6 and {c.repeat for c in firsts} == {0}  # the first repeat of each point and seed
    # every run: 2 precisions x 3 N x 2 repeats, the repeats of a point side by side
    assert len(curves) == 12 and [c.repeat for c in curves[:2]] == [0, 1]
    assert all(len(c.steps) <= 200 and c.steps[0] == 0 and c.steps[-1] == 1000 for c in curves)
    assert curves[0].num_steps == 1001 and len(curves[0].steps) >= 150
    assert len(small) == 4 and [len(c.steps) for c in small] == [7, 7, 7, 7]
    assert small[0].steps == [0, 167, 334, 501, 668, 835, 1000]


def test_compare_ratios_and_bad_ids(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        a, _ = add_experiment(s)
        b, _ = add_experiment(s, precisions=["bf16"])
    _finish_all(pg_session_factory, a)
    _finish_all(pg_session_factory, b)
    r = client.get(f"/compare?experiments={a},{b}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [e["id"] for e in body["experiments"]] == [a, b] and body["reference_experiment_id"] == a
    assert sorted((x["precision"], x["num_devices"], x["ratio"]) for x in body["ratios"]) == [
        ("bf16", 1, 1.0),
        ("bf16", 2, 1.0),
        ("bf16", 4, 1.0),
    ]
    assert client.get(f"/compare?experiments={a},{b}", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    for bad in (f"{a},x", f"{a}", f"{a},{a}", "", f"{a},-1"):
        p = client.get(f"/compare?experiments={bad}")
        assert p.status_code == 422, bad
        assert p.json()["errors"][0]["field"] == "query.experiments", bad
    missing = client.get(f"/compare?experiments={a},9999").json()
    assert missing["errors"][0]["field"] == "query.experiments" and "9999" in missing["errors"][0]["message"]


def test_cached_answer_is_rebuilt_when_a_run_ends(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, run_ids = add_experiment(s, precisions=["bf16"])
        claim_run(s, run_ids[0], "w", "h", 60)
    first = client.get(f"/experiments/{exp_id}/scaling")
    again = client.get(f"/experiments/{exp_id}/scaling")
    assert again.content == first.content and again.headers["etag"] == first.headers["etag"]
    assert first.json()["series"][0]["points"][0]["status"] == "pending"
    with session_scope(pg_session_factory) as s:
        key = s.scalar(sa.text("SELECT run_key FROM runs WHERE id = :i"), {"i": run_ids[0]})
        assert record_result(s, run_ids[0], _result(key, 1000.0, 1))
    after = client.get(f"/experiments/{exp_id}/scaling")
    assert after.headers["etag"] != first.headers["etag"]
    assert after.json()["series"][0]["points"][0]["tokens_per_sec"] == 1000.0


def test_cli_plot_writes_the_png(test_settings, pg_session_factory, tmp_path) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from tests.live_server import live_server

    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_all(pg_session_factory, exp_id, fail_n=4)
    out = tmp_path / "plots" / "curves.png"
    with live_server(test_settings) as url:
        ok = CliRunner().invoke(app, ["plot", str(exp_id), "-o", str(out), "--server", url])
        missing = CliRunner().invoke(app, ["plot", "999", "-o", str(tmp_path / "x.png"), "--server", url])
    assert ok.exit_code == 0, ok.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert missing.exit_code == 1 and "experiment 999 does not exist" in missing.output
    assert not (tmp_path / "x.png").exists()


def test_fingerprint_reuse_window(make_client, test_settings, pg_session_factory) -> None:
    """Within Settings.etag_ttl_s a poll reuses the process's fingerprint (no query); after it, the change shows."""
    # 3 s: on a loaded 2-core runner the status change and the next poll have taken longer than 0.5 s
    client = make_client(dataclasses.replace(test_settings, etag_ttl_s=3.0))
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    path = f"/experiments/{exp_id}"
    tag = client.get(path).headers["etag"]
    _status_change(pg_session_factory, exp_id)
    assert client.get(path, headers={"If-None-Match": tag}).status_code == 304  # at most etag_ttl_s late
    assert client.get(path).json()["counts"]["running"] == 1  # a full answer is always read fresh
    time.sleep(3.2)
    assert client.get(path, headers={"If-None-Match": tag}).status_code == 200


def test_served_reports_equal_the_per_run_reports(client, pg_session_factory) -> None:
    """/scaling (JSON and CSV) and /compare, built from the aggregated points, hold byte for byte what
    core.analysis.scaling.build_report over one RunPoint per run (the previous read) gives."""
    from api.compare import CompareExperiment, compare
    from core.analysis.scaling import build_report, to_csv

    with session_scope(pg_session_factory) as s:
        a, _ = add_experiment(s, repeats=3)
        b, _ = add_experiment(s, precisions=["bf16"])
    _finish_all(pg_session_factory, a, fail_n=2)
    _finish_all(pg_session_factory, b)
    sizes = {"local-cpu": 64}
    with pg_session_factory() as s:
        old = {
            i: build_report(
                db.points.load_run_points(s, i),
                baseline_num_devices=4,  # every N=2 run of a failed: a baseline it measured
                full_size_by_cluster=sizes,
                run_losses=db.points.load_run_losses(s, i),
            )
            for i in (a, b)
        }
        names = {i: s.get(Experiment, i) for i in (a, b)}
    r = client.get(f"/experiments/{a}/scaling?full_size=64&baseline_num_devices=4")
    assert r.content == old[a].model_dump_json().encode()
    csv = client.get(f"/experiments/{a}/scaling?format=csv&full_size=64&baseline_num_devices=4")
    assert csv.text == to_csv(old[a])
    expected = compare(
        [
            CompareExperiment(id=i, name=names[i].name, cluster=names[i].cluster, source=names[i].source, report=old[i])
            for i in (a, b)
        ]
    )
    got = client.get(f"/compare?experiments={a},{b}&full_size=64&baseline_num_devices=4")
    assert got.content == expected.model_dump_json().encode()


def test_losses_state_their_downsampling(client, pg_session_factory) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, precisions=["bf16"])
    _finish_all(pg_session_factory, exp_id, num_steps=2500)
    body = client.get(f"/experiments/{exp_id}/losses?max_points=100").json()
    assert "k = ceil((n - 1) / (max_points - 1))" in body["downsampling"]
    assert [(c["source"], c["stored_stride"], c["num_steps"]) for c in body["curves"]] == [("store", 2, 2500)] * 3
    assert all(len(c["steps"]) <= 100 and c["steps"][0] == 0 and c["steps"][-1] == 2499 for c in body["curves"])


def test_an_expired_fingerprint_is_refreshed_by_one_request_at_a_time(monkeypatch) -> None:
    """While one request refreshes an expired fingerprint, the others answer from the expired one instead
    of running the same query (no stampede of pollers when it expires)."""
    import threading

    from api import caches

    calls: list[list[int]] = []
    entered, release = threading.Event(), threading.Event()

    def slow_fingerprints(session, ids):
        calls.append(list(ids))
        entered.set()
        assert release.wait(10)
        return {i: f"v{len(calls)}" for i in ids}

    monkeypatch.setattr(caches, "fingerprints", slow_fingerprints)
    cache = caches.FingerprintCache(ttl_s=0.05)
    release.set()
    assert cache.get(None, [1]) == {1: "v1"}
    release.clear()
    entered.clear()
    time.sleep(0.06)  # expired
    out: list[dict] = []
    refresher = threading.Thread(target=lambda: out.append(cache.get(None, [1])))
    refresher.start()
    assert entered.wait(10)
    assert cache.get(None, [1]) == {1: "v1"}  # the expired value, served while the other thread refreshes
    assert calls == [[1], [1]]
    release.set()
    refresher.join(10)
    assert out == [{1: "v2"}] and cache.get(None, [1]) == {1: "v2"} and len(calls) == 2
