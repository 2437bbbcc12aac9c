"""scaling reads: series columns and indexes on runs, run_summaries.final_loss, run_loss_curves (backfilled)

runs.model / num_layers / scaling are copied from the run spec JSON (so that the scaling series are
grouped on plain columns), run_summaries.final_loss from the result JSON, and run_loss_curves holds each
run's loss curve thinned to at most 2,000 points, built here from step_metrics for the runs recorded so far. ix_runs_scaling_points serves the scaling
points by an index-only scan; ix_runs_experiment_id_status now covers the change fingerprint (INCLUDE).

Revision ID: 0007_scaling_reads
Revises: 0006_run_traces
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import chain

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007_scaling_reads"
down_revision: str | Sequence[str] | None = "0006_run_traces"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STORED_CURVE_POINTS = 2000  # = db.points.STORED_CURVE_POINTS when this revision was written
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("spec", _JSON),
    sa.column("result", _JSON),
    sa.column("model", sa.String),
    sa.column("num_layers", sa.Integer),
    sa.column("scaling", sa.String),
)
_summaries = sa.table("run_summaries", sa.column("run_id", sa.Integer), sa.column("final_loss", sa.Float))
_steps = sa.table(
    "step_metrics", sa.column("run_id", sa.Integer), sa.column("step", sa.Integer), sa.column("loss", sa.Float)
)
_curves = sa.table(
    "run_loss_curves",
    sa.column("run_id", sa.Integer),
    sa.column("num_steps", sa.Integer),
    sa.column("stride", sa.Integer),
    sa.column("steps_i64", sa.LargeBinary),
    sa.column("losses_f64", sa.LargeBinary),
)


def _packed(typecode: str, values: list) -> bytes:
    a = array(typecode, values)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def _thinned_curves(conn: sa.Connection) -> Iterator[dict]:
    """Every run's steps with a loss, streamed in (run, step) order and thinned as db.points.store_loss_curve does."""
    rows = conn.execute(
        sa.select(_steps.c.run_id, _steps.c.step, _steps.c.loss)
        .where(_steps.c.loss.is_not(None))
        .order_by(_steps.c.run_id, _steps.c.step)
        .execution_options(yield_per=10_000)
    )
    run_id, steps, losses = None, [], []
    for rid, step, loss in chain(rows, [(None, None, None)]):  # the sentinel ends the last run
        if rid != run_id and run_id is not None:
            n, m = len(steps), STORED_CURVE_POINTS
            stride = 1 if n <= m else (n + m - 3) // (m - 1)
            keep = [i for i in range(n) if i % stride == 0 or i == n - 1]
            yield dict(
                run_id=run_id,
                num_steps=n,
                stride=stride,
                steps_i64=_packed("q", [steps[i] for i in keep]),
                losses_f64=_packed("d", [losses[i] for i in keep]),
            )
            steps, losses = [], []
        run_id = rid
        steps.append(step)
        losses.append(loss)


def upgrade() -> None:
    op.create_table(
        "run_loss_curves",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("num_steps", sa.Integer(), nullable=False),
        sa.Column("stride", sa.Integer(), nullable=False),
        sa.Column("steps_i64", sa.LargeBinary(), nullable=False),
        sa.Column("losses_f64", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_loss_curves_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_loss_curves")),
    )
    # Plain ADD COLUMNs, no table copy: on SQLite a batch copy of `runs` drops the old table, and with
    # foreign keys on that would cascade to every row referencing a run. NOT NULL needs a placeholder
    # default while the rows are backfilled; PostgreSQL drops it after, SQLite keeps it (harmless: every
    # insert sets the columns).
    op.add_column("run_summaries", sa.Column("final_loss", sa.Double(), nullable=True))
    op.add_column("runs", sa.Column("model", sa.String(length=32), nullable=False, server_default=""))
    op.add_column("runs", sa.Column("num_layers", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("scaling", sa.String(length=16), nullable=False, server_default=""))

    conn = op.get_bind()
    spec = _runs.c.spec
    conn.execute(
        _runs.update().values(
            model=spec["model"].as_string(),
            num_layers=spec["num_layers"].as_integer(),
            scaling=spec["scaling"].as_string(),
        )
    )
    final_loss = (
        sa.select(_runs.c.result[("numerics", "final_loss")].as_float())
        .where(_runs.c.id == _summaries.c.run_id)
        .scalar_subquery()
    )
    conn.execute(_summaries.update().values(final_loss=final_loss))
    batch: list[dict] = []
    for row in _thinned_curves(conn):
        batch.append(row)
        if len(batch) >= 500:
            conn.execute(_curves.insert(), batch)
            batch = []
    if batch:
        conn.execute(_curves.insert(), batch)

    if conn.dialect.name != "sqlite":
        for name in ("model", "num_layers", "scaling"):
            op.alter_column("runs", name, server_default=None)
    op.drop_index("ix_runs_experiment_id_status", table_name="runs")
    op.create_index(
        "ix_runs_experiment_id_status",
        "runs",
        ["experiment_id", "status"],
        postgresql_include=[
            "id",
            "attempts",
            "cancel_requested",
            "dispatched_at",
            "slurm_job_id",
            "started_at",
            "finished_at",
        ],
    )
    op.create_index(
        "ix_runs_scaling_points",
        "runs",
        ["experiment_id", "model", "num_layers", "precision", "layout", "scaling", "cluster", "num_devices", "id"],
        postgresql_include=["status", "imported", "finished_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_runs_scaling_points", table_name="runs")
    op.drop_index("ix_runs_experiment_id_status", table_name="runs")
    op.create_index("ix_runs_experiment_id_status", "runs", ["experiment_id", "status"])
    for name in ("scaling", "num_layers", "model"):
        op.drop_column("runs", name)  # SQLite >= 3.35 drops a column in place (no table copy)
    op.drop_column("run_summaries", "final_loss")
    op.drop_table("run_loss_curves")
