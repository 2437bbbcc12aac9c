"""db.imports: imported curves land in the loss-curve table (bounded transactions), on SQLite (the embedded
stack's store) as on PostgreSQL, and the fp8 loss verdict and /losses read them there too."""

from __future__ import annotations

import pytest

from core.settings import Settings
from db.imports import ImportedSteps, curve_chunks, step_chunks
from db.points import STORED_CURVE_POINTS, _unpacked
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token
from tests.api.test_import import BASE, _seed_points


def test_curve_chunks_store_each_run_thinned_and_bound_each_transaction() -> None:
    long = ImportedSteps(rows=[(s, 5.0 - s * 1e-4, None, 0, False) for s in range(5000)])
    short = ImportedSteps(rows=[(0, 3.0, 100.0, 64, True), (10, None, 90.0, 64, False), (20, 2.5, 91.0, 64, False)])
    chunks = list(curve_chunks([1, 2, 3], [long, short, ImportedSteps(rows=[])], values_per_chunk=STORED_CURVE_POINTS))
    assert [[row["run_id"] for row in c] for c in chunks] == [[1], [2]]  # run 3 has no loss: no row
    first, second = chunks[0][0], chunks[1][0]
    assert first["num_steps"] == 5000 and first["stride"] == 3
    assert len(_unpacked("q", first["steps_i64"])) <= STORED_CURVE_POINTS
    assert _unpacked("q", second["steps_i64"]) == [0, 20] and _unpacked("d", second["losses_f64"]) == [3.0, 2.5]
    rows = [r for c in step_chunks([1, 2], [long, short], rows_per_chunk=2000) for r in c]
    assert len(rows) == 5003 and rows[-2] == (2, 10, None, 90.0, 64, None, None, False)


def test_sqlite_import_gets_curves_and_the_verdict(make_client, test_settings, sqlite_url, tmp_path) -> None:
    with session_scope(make_session_factory(make_engine(sqlite_url))) as s:
        token, _ = create_token(s, "t")
    settings = Settings(
        data_dir=tmp_path, database_url=sqlite_url, broker_url=test_settings.broker_url, runs_dir=tmp_path / "runs"
    )
    client = make_client(settings)
    client.headers["Authorization"] = f"Bearer {token}"
    r = client.post("/experiments/import", json=BASE | {"points": _seed_points(1.03, seeds=(0, 1))})
    assert r.status_code == 201, r.text
    exp_id = r.json()["id"]
    (sp,) = [s for s in client.get(f"/experiments/{exp_id}/scaling").json()["speedups"]]
    assert sp["loss_verdict"] == "differs" and sp["loss_gap"] == pytest.approx(0.03, abs=5e-3), sp
    curves = client.get(f"/experiments/{exp_id}/losses").json()["curves"]
    assert [(c["precision"], c["seed"]) for c in curves] == [
        ("bf16", 0),
        ("bf16", 1),
        ("fp8-rowwise", 0),
        ("fp8-rowwise", 1),
    ]
    assert all(c["source"] == "store" and len(c["eval_steps"]) == 20 for c in curves)
