"""Migration 0007_scaling_reads backfills what the scaling reads need from the rows written before it, on
SQLite and on PostgreSQL (a database of its own, dropped after)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

import db.points
from db.models import Run, RunLossCurve, RunSummary
from db.session import make_engine, make_session_factory

REPO = Path(__file__).resolve().parents[2]
BEFORE = "0003_run_logs"


def _config(url: str) -> Config:
    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes.update(url=url, configure_logger=False)
    return cfg


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path, pg_url) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
        return
    name = pg_url.rsplit("/", 1)[1] + "_migrate"
    admin = sa.create_engine(pg_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield pg_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _losses(num_steps: int) -> list[tuple[int, float]]:
    return [(i, 10.0 / (i + 1) + i * 1e-7) for i in range(num_steps)]


def _seed_before(url: str) -> list[int]:
    """Rows as revision 0003 held them: 3 runs (2500 steps, 5 steps with one loss missing, none), their
    spec and result JSON and one summary. Returns the run ids."""
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["experiments", "runs", "run_summaries", "step_metrics"])
    t = meta.tables
    now = sa.func.current_timestamp()
    with engine.begin() as conn:
        exp_id = conn.execute(
            t["experiments"]
            .insert()
            .values(name="old", cluster="local-cpu", spec={}, tags=[], source="api", created_at=now)
            .returning(t["experiments"].c.id)
        ).scalar_one()
        ids = []
        for i, (model, layers, scaling) in enumerate([("8b", 4, "weak"), ("debug", 2, "strong"), ("1b", 16, "weak")]):
            ids.append(
                conn.execute(
                    t["runs"]
                    .insert()
                    .values(
                        experiment_id=exp_id,
                        run_key=f"k{i}",
                        precision="bf16",
                        layout="fsdp",
                        num_devices=1,
                        repeat=0,
                        cluster="local-cpu",
                        queue="q",
                        status="succeeded",
                        cancel_requested=False,
                        attempts=1,
                        created_at=now,
                        imported=False,
                        spec={"model": model, "num_layers": layers, "scaling": scaling},
                        result={"numerics": {"final_loss": 2.5 + i}},
                    )
                    .returning(t["runs"].c.id)
                ).scalar_one()
            )
        conn.execute(
            t["run_summaries"]
            .insert()
            .values(
                run_id=ids[0],
                num_timed_steps=1,
                tokens_per_step=1,
                tokens_per_sec=1.0,
                tokens_per_sec_per_device=1.0,
                step_ms_median=1.0,
                step_ms_min=1.0,
                step_ms_max=1.0,
                flops_per_token=1,
                tflops_per_device=1.0,
            )
        )
        rows = [dict(run_id=ids[0], step=s, loss=v) for s, v in _losses(2500)]
        rows += [dict(run_id=ids[1], step=s, loss=None if s == 3 else v) for s, v in _losses(5)]
        conn.execute(t["step_metrics"].insert(), [r | dict(tokens=0, warmup=False) for r in rows])
    engine.dispose()
    return ids


def test_upgrade_backfills_series_columns_final_loss_and_curves(empty_url) -> None:
    command.upgrade(_config(empty_url), BEFORE)
    ids = _seed_before(empty_url)
    command.upgrade(_config(empty_url), "head")
    engine = make_engine(empty_url)
    factory = make_session_factory(engine)
    try:
        with factory() as s:
            cols = s.execute(sa.select(Run.model, Run.num_layers, Run.scaling).order_by(Run.id)).all()
            assert [tuple(c) for c in cols] == [("8b", 4, "weak"), ("debug", 2, "strong"), ("1b", 16, "weak")]
            assert s.scalar(sa.select(RunSummary.final_loss)) == 2.5
            assert s.scalar(sa.select(sa.func.count()).select_from(RunSummary)) == 1
            migrated = {
                c.run_id: (c.num_steps, c.stride, c.steps_i64, c.losses_f64) for c in s.scalars(sa.select(RunLossCurve))
            }
            assert set(migrated) == {ids[0], ids[1]} and migrated[ids[0]][:2] == (2500, 2)
            assert migrated[ids[1]][:2] == (4, 1)  # the step without a loss is left out
            # what record_result stores for the same points, byte for byte
            db.points.store_loss_curve(s, ids[0], _losses(2500))
            db.points.store_loss_curve(s, ids[1], [p for p in _losses(5) if p[0] != 3])
            s.flush()
            stored = {
                c.run_id: (c.num_steps, c.stride, c.steps_i64, c.losses_f64)
                for c in s.scalars(sa.select(RunLossCurve).execution_options(populate_existing=True))
            }
            assert stored == migrated
            s.rollback()
    finally:
        engine.dispose()
    command.downgrade(_config(empty_url), BEFORE)  # and back, every row kept (no table copy cascading)
    engine = sa.create_engine(empty_url)
    with engine.connect() as conn:
        counts = [
            conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar()
            for t in ("runs", "run_summaries", "step_metrics")
        ]
    engine.dispose()
    assert tuple(counts) == (3, 1, 2505)
