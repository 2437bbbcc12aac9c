"""The fp8 loss verdict, wired end to end with curves long enough to give one: 400-step loss curves recorded the
way a worker records them (db.runs.record_result), then read through GET /experiments/{id}/scaling (JSON and
CSV) and through the nightly detection's `numerics` metric. Close curves must say `tracks`, a 5% gap `differs`.

The curves: bf16 loss 2 + 3 exp(-step / 50) with N(0, 0.01) step noise (seeded); fp8 the same shape with its
own noise, or 1.05 times it; three seeds a point (with one seed the verdict widens its band by a seed-spread
allowance wider than the 1% tolerance, and does not conclude `tracks`). Over the verdict's window the loss falls
by < 0.1% and the noise band is ~0.2%, both well inside the 1% tolerance, so the answer is the gap alone.
"""

from __future__ import annotations

import csv
import io
import math
import random
from datetime import timedelta

import sqlalchemy as sa

import db.runs
from core.contracts.clusters import LOCAL_CPU
from core.contracts.specs import RunResult, RunSpec, StepRecord
from db.models import Regression
from db.suites import create_suite_experiment
from tests.db.nights import ENV, NOMINAL_TPS, T0, make_suite, result, suite_spec
from worker.nightly import evaluate_finished

NUM_STEPS = 400


def curve(seed: int, scale: float) -> list[float]:
    rng = random.Random(seed)
    return [scale * (2.0 + 3.0 * math.exp(-step / 50)) + rng.gauss(0.0, 0.01) for step in range(NUM_STEPS)]


def with_curve(spec: RunSpec, losses: list[float]) -> RunResult:
    base = result(spec, NOMINAL_TPS[(spec.precision, spec.num_devices)], ENV, final_loss=losses[-1])
    steps = [StepRecord(step=i, loss=v, step_ms=10.0, tokens=2048) for i, v in enumerate(losses)]
    return base.model_copy(update={"steps": steps})


def add_night(factory, suite, night: int, fp8_scale: float) -> int:
    """Night `night`: the suite's experiment, each run with a 400-step curve; fp8 runs scaled by fp8_scale."""
    at = T0 + timedelta(days=night)
    with factory() as s:
        exp, run_ids = create_suite_experiment(s, suite, LOCAL_CPU, now=at)
        s.commit()
        for run_id in run_ids:
            spec = RunSpec.model_validate(db.runs.get_run(s, run_id).spec)
            scale = 1.0 if spec.precision == "bf16" else fp8_scale
            losses = curve(seed=1000 * night + run_id, scale=scale)
            db.runs.record_result(s, run_id, with_curve(spec, losses), now=at + timedelta(minutes=30))
        s.commit()
    evaluate_finished(factory, at + timedelta(hours=1))
    return exp.id


def verdicts(client, exp_id: int) -> tuple[dict[int, str], dict[int, str]]:
    """fp8 loss verdict by N, from the JSON speedups and from the CSV's fp8 rows."""
    r = client.get(f"/experiments/{exp_id}/scaling")
    assert r.status_code == 200, r.text
    speedups = r.json()["speedups"]
    assert {sp["precision"] for sp in speedups} == {"fp8-tensorwise"}
    from_json = {sp["num_devices"]: sp["loss_verdict"] for sp in speedups}
    r = client.get(f"/experiments/{exp_id}/scaling?format=csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
    rows = list(csv.DictReader(io.StringIO(r.text)))
    from_csv = {int(row["num_devices"]): row["loss_verdict"] for row in rows if row["precision"] == "fp8-tensorwise"}
    assert all(row["loss_verdict"] == "" for row in rows if row["precision"] == "bf16")
    return from_json, from_csv


def numerics_regressions(factory) -> list[Regression]:
    with factory() as s:
        stmt = sa.select(Regression).where(Regression.metric == "numerics").order_by(Regression.id)
        return list(s.scalars(stmt))


def test_close_curves_track_and_a_five_percent_gap_differs_through_api_csv_and_nightly(
    client, pg_session_factory
) -> None:
    with pg_session_factory() as s:
        suite = make_suite(s, spec=suite_spec(seeds=[0, 1, 2]))
    close = [add_night(pg_session_factory, suite, night, fp8_scale=1.0) for night in range(2)]
    for exp_id in close:
        from_json, from_csv = verdicts(client, exp_id)
        assert from_json == {1: "tracks", 2: "tracks"}, from_json
        assert from_csv == from_json
    assert numerics_regressions(pg_session_factory) == []  # tracking nights raise nothing

    apart = add_night(pg_session_factory, suite, 2, fp8_scale=1.05)
    from_json, from_csv = verdicts(client, apart)
    assert from_json == {1: "differs", 2: "differs"}, from_json
    assert from_csv == from_json
    rows = numerics_regressions(pg_session_factory)
    # one per nightly series point: the run key holds the seed, so 2 GPU counts x 3 seeds
    assert len(rows) == 2 * 3 and {r.value for r in rows} == {1.0}, [(r.status, r.value, r.message) for r in rows]
    assert {r.status for r in rows} <= {"suspected", "confirmed"}, [r.status for r in rows]
