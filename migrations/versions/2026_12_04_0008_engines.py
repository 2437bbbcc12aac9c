"""engines and seeds: runs.engine and runs.seed as columns (the engine is part of the scaling series key),
run_summaries.step_time_source (how the engine's step times were taken)

runs.engine is the training stack of the run (scalebench, torchtitan, command:<name>) and runs.seed its seed,
both copied from the run spec JSON like model / num_layers / scaling. Runs recorded before engines existed
ran the scalebench runner: the server default says so. ix_runs_scaling_points leads with the engine after the
experiment, so that the scaling points are still read by an index-only scan in group order.

Revision ID: 0008_engines
Revises: 0007_scaling_reads
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008_engines"
down_revision: str | Sequence[str] | None = "0007_scaling_reads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("spec", _JSON), sa.column("seed", sa.Integer))


def upgrade() -> None:
    # Plain ADD COLUMNs (no batch table copy on SQLite: see 0007); the server defaults stay, as in the model.
    op.add_column("runs", sa.Column("engine", sa.String(length=80), server_default="scalebench", nullable=False))
    op.add_column("runs", sa.Column("seed", sa.Integer(), server_default="0", nullable=False))
    op.add_column("run_summaries", sa.Column("step_time_source", sa.String(length=120), nullable=True))
    conn = op.get_bind()
    conn.execute(_runs.update().values(seed=sa.func.coalesce(_runs.c.spec["seed"].as_integer(), 0)))
    op.drop_index("ix_runs_scaling_points", table_name="runs")
    op.create_index(
        "ix_runs_scaling_points",
        "runs",
        [
            "experiment_id",
            "engine",
            "model",
            "num_layers",
            "precision",
            "layout",
            "scaling",
            "cluster",
            "num_devices",
            "id",
        ],
        postgresql_include=["status", "imported", "finished_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_runs_scaling_points", table_name="runs")
    op.create_index(
        "ix_runs_scaling_points",
        "runs",
        ["experiment_id", "model", "num_layers", "precision", "layout", "scaling", "cluster", "num_devices", "id"],
        postgresql_include=["status", "imported", "finished_at"],
    )
    op.drop_column("run_summaries", "step_time_source")
    op.drop_column("runs", "seed")
    op.drop_column("runs", "engine")
