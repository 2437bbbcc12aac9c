"""GET /experiments/{id}/breakdown (JSON, CSV, ETag) and GET /runs/{id}/trace (streamed, gzip or not), on the
real Postgres, with results recorded the way workers record them and traces shipped by worker.execution."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os

import pytest
import sqlalchemy as sa

import db.runs
from core.analysis.breakdown import (
    CATEGORY_KEYS,
    PARTITION,
    Breakdown,
    StepBreakdown,
    median_over_ranks,
    trace_file_name,
)
from core.contracts.clusters import LOCAL_CPU
from core.contracts.specs import RunResult
from core.settings import Settings
from db.session import session_scope
from tests.db.helpers import add_experiment, succeeded_result
from worker.execution import ship_traces
from worker.runtime import Runtime


@pytest.fixture
def test_settings(test_settings: Settings) -> Settings:
    """These tests change runs and look at once."""
    return dataclasses.replace(test_settings, etag_ttl_s=0.0)


def step_breakdown(n: int, precision: str, rank: int = 0) -> dict[str, float]:
    """A step of N ranks: fp8 moves GEMM time from bf16 to fp8 and adds casts; communication grows with N and
    is partly hidden; ranks differ a little. The parts add up to step_ms."""
    fp8 = precision != "bf16"
    parts = {
        "gemm_bf16_ms": 20.0 if fp8 else 60.0,
        "gemm_fp8_ms": 25.0 if fp8 else 0.0,
        "fp8_cast_ms": 9.0 + rank if fp8 else 0.0,
        "attention_ms": 12.0,
        "elementwise_ms": 15.0 + rank,
        "optimizer_ms": 8.0,
        "exposed_communication_ms": 6.0 * (n - 1) + rank,
        "idle_ms": 3.0,
    }
    overlapped = 4.0 * (n - 1)
    return {
        **parts,
        "step_ms": sum(parts.values()),
        "communication_ms": parts["exposed_communication_ms"] + overlapped,
        "overlapped_communication_ms": overlapped,
    }


def breakdown_of(n: int, precision: str, profiled_steps: tuple[int, ...] = (7, 8, 9)) -> Breakdown:
    per_rank = [{"rank": r, **step_breakdown(n, precision, r)} for r in range(n)]
    ranks = [StepBreakdown(**{k: v for k, v in r.items() if k != "rank"}) for r in per_rank]
    return Breakdown.model_validate(
        {"profiled_steps": list(profiled_steps), "per_rank": per_rank, "median": median_over_ranks(ranks).model_dump()}
    )


def record_profiled(factory, exp_id: int, skip: set[tuple[str, int]] = frozenset()) -> dict[tuple[str, int], int]:
    """Every run of the experiment succeeded with a breakdown (except the (precision, N) in skip)."""
    ids = {}
    with session_scope(factory) as s:
        rows = s.execute(
            sa.text("SELECT id, run_key, precision, num_devices FROM runs WHERE experiment_id = :e"), {"e": exp_id}
        ).all()
        for run_id, key, precision, n in rows:
            ids[(precision, n)] = run_id
            db.runs.claim_run(s, run_id, "w", "h", 60)
            result = succeeded_result(key, num_steps=10)
            if (precision, n) not in skip:
                result = RunResult.model_validate({**result.model_dump(), "breakdown": breakdown_of(n, precision)})
            db.runs.record_result(s, run_id, result)
    return ids


def test_breakdown_series_along_n_with_exposed_share(client, pg_session_factory):
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, profile_steps=3, steps=10)
    ids = record_profiled(pg_session_factory, exp_id, skip={("bf16", 4)})  # bf16 N=4: not profiled
    r = client.get(f"/experiments/{exp_id}/breakdown")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["categories"] == list(CATEGORY_KEYS) and body["partition"] == list(PARTITION)
    series = {(s["precision"], s["layout"]): s["points"] for s in body["series"]}
    assert set(series) == {("bf16", "fsdp"), ("fp8-tensorwise", "fsdp")}
    assert [p["num_devices"] for p in series[("bf16", "fsdp")]] == [1, 2]
    assert [p["num_devices"] for p in series[("fp8-tensorwise", "fsdp")]] == [1, 2, 4]
    four = series[("fp8-tensorwise", "fsdp")][2]
    # median over ranks 0..3 of the rank-dependent parts: fp8_cast 9 + 1.5, exposed 18 + 1.5
    assert four["fp8_cast_ms"] == pytest.approx(10.5) and four["exposed_communication_ms"] == pytest.approx(19.5)
    assert four["communication_ms"] == pytest.approx(19.5 + 12.0)
    assert four["run_ids"] == [ids[("fp8-tensorwise", 4)]] and four["num_runs"] == 1
    assert four["exposed_communication_share"] == pytest.approx(19.5 / four["step_ms"])
    shares = [p["exposed_communication_share"] for p in series[("fp8-tensorwise", "fsdp")]]
    assert shares[0] == 0 and shares[0] < shares[1] < shares[2]
    for points in series.values():
        for p in points:
            assert sum(p[k] for k in PARTITION) == pytest.approx(p["step_ms"], rel=0.02)


def test_breakdown_csv_and_etag(client, pg_session_factory):
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, profile_steps=3, steps=10)
    record_profiled(pg_session_factory, exp_id)
    r = client.get(f"/experiments/{exp_id}/breakdown", params={"format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 6 and list(rows[0])[:4] == ["precision", "layout", "num_devices", "num_runs"]
    js = client.get(f"/experiments/{exp_id}/breakdown").json()
    by = {(p["precision"], int(p["num_devices"])): p for p in rows}
    for s in js["series"]:
        for p in s["points"]:
            row = by[(s["precision"], p["num_devices"])]
            for k in (*CATEGORY_KEYS, "exposed_communication_share"):
                assert float(row[k]) == pytest.approx(p[k])
    etag = client.get(f"/experiments/{exp_id}/breakdown").headers["etag"]
    again = client.get(f"/experiments/{exp_id}/breakdown", headers={"If-None-Match": etag})
    assert again.status_code == 304


def test_breakdown_empty_unprofiled_404_and_422(client, pg_session_factory):
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s)
    record_profiled(pg_session_factory, exp_id, skip={(p, n) for p in ("bf16", "fp8-tensorwise") for n in (1, 2, 4)})
    assert client.get(f"/experiments/{exp_id}/breakdown").json()["series"] == []
    missing = client.get("/experiments/999999/breakdown")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    assert "experiment 999999 does not exist" in missing.json()["detail"]
    bad = client.get(f"/experiments/{exp_id}/breakdown", params={"format": "xml"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.format"


def test_profile_steps_validated_and_kept_out_of_the_run_key(client):
    spec = {
        "name": "p",
        "model": "debug",
        "gpu_counts": [1],
        "precisions": ["bf16"],
        "steps": 6,
        "warmup_steps": 2,
        "profile_steps": 4,
    }
    r = client.post("/experiments", json=spec)
    assert r.status_code == 422
    assert "profile_steps(4) leaves no timed step" in r.text
    ok = client.post("/experiments", json=spec | {"profile_steps": 3})
    plain = client.post("/experiments", json=spec | {"profile_steps": 0, "name": "q"})
    assert ok.status_code == plain.status_code == 201
    run = client.get(f"/runs/{ok.json()['runs'][0]['id']}").json()
    unprofiled = client.get(f"/runs/{plain.json()['runs'][0]['id']}").json()
    assert run["spec"]["profile_steps"] == 3 and run["run_key"] == unprofiled["run_key"]


def _chrome_trace(rank: int) -> bytes:
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {"rank": rank},
        }
        for i in range(2000)
    ]
    return gzip.compress(json.dumps({"traceEvents": events, "distributedInfo": {"rank": rank}}).encode())


def test_worker_ships_each_ranks_trace_and_the_api_streams_it(
    client, pg_session_factory, pg_engine, test_settings, tmp_path
):
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rank in (0, 1):
        (run_dir / trace_file_name(rank)).write_bytes(_chrome_trace(rank))
    (run_dir / "trace.rankX.json.gz").write_bytes(b"not a rank")  # ignored: not a trace file name
    rt = Runtime(
        settings=test_settings,
        clusters={LOCAL_CPU.name: LOCAL_CPU},
        engine=pg_engine,
        session_factory=pg_session_factory,
        pid=os.getpid(),
    )
    assert ship_traces(rt, ids[0], run_dir) == 2

    plain = client.get(f"/runs/{ids[0]}/trace", params={"rank": 1}, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    assert plain.headers["content-type"] == "application/json"
    assert plain.json()["distributedInfo"] == {"rank": 1} and len(plain.json()["traceEvents"]) == 2000
    zipped = client.get(f"/runs/{ids[0]}/trace")  # httpx accepts gzip: sent as stored, decoded by the client
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) == len(_chrome_trace(0))
    assert zipped.json()["distributedInfo"] == {"rank": 0}
    assert client.get(f"/runs/{ids[0]}").json()["links"]["trace"] == f"/runs/{ids[0]}/trace"

    other = client.get(f"/runs/{ids[0]}/trace", params={"rank": 2})
    assert other.status_code == 404 and "stored ranks: [0, 1]" in other.json()["detail"]
    none = client.get(f"/runs/{ids[1]}/trace")
    assert none.status_code == 404 and none.headers["content-type"] == "application/problem+json"
    assert "has no trace" in none.json()["detail"] and "profile_steps" in none.json()["detail"]
    assert client.get(f"/runs/{ids[0]}/trace", params={"rank": -1}).status_code == 422
    assert client.get("/runs/999999/trace").status_code == 404


def test_show_prints_the_breakdown_table(test_settings, api_token, pg_session_factory):
    from typer.testing import CliRunner

    from cli.main import app as cli
    from tests.live_server import live_server

    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, profile_steps=3, steps=10)
        plain_id, _ = add_experiment(s, name="unprofiled")
    record_profiled(pg_session_factory, exp_id)
    record_profiled(pg_session_factory, plain_id, skip={(p, n) for p in ("bf16", "fp8-tensorwise") for n in (1, 2, 4)})
    with live_server(test_settings) as url:
        shown = CliRunner().invoke(cli, ["show", str(exp_id), "--server", url, "--token", api_token])
        plain = CliRunner().invoke(cli, ["show", str(plain_id), "--server", url, "--token", api_token])
    assert shown.exit_code == 0, shown.output
    assert "Where the step time goes" in shown.stdout and "exp%" in shown.stdout
    rows = [line.split("│") for line in shown.stdout.splitlines() if "fp8-tensorwise" in line and "│ 4 " in line]
    cells = [c.strip() for c in rows[-1]]
    step = step_breakdown(4, "fp8-tensorwise")["step_ms"] + 3 * 1.5  # three parts grow by rank; ranks 0..3
    assert f"{step:.1f}" in cells and "19.5" in cells and f"{19.5 / step:.1%}" in cells, "|".join(cells)
    assert plain.exit_code == 0 and "Scaling" in plain.stdout and "Where the step time goes" not in plain.stdout
