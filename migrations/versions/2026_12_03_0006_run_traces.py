"""run_traces: each rank's profiler trace of a profiled run, gzipped, shipped by the worker

Revision ID: 0006_run_traces
Revises: 0005_run_order
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_run_traces"
down_revision: str | Sequence[str] | None = "0005_run_order"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_traces",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("data_gzip", sa.LargeBinary(), nullable=False),
        sa.Column("gzip_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_traces_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", name=op.f("pk_run_traces")),
    )


def downgrade() -> None:
    op.drop_table("run_traces")
