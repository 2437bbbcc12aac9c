"""run_logs: the tail of each run's log, shipped by the worker (read by the API from the store)

Revision ID: 0003_run_logs
Revises: 0002_nightly
Create Date: 2026-12-03 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_run_logs"
down_revision: str | Sequence[str] | None = "0002_nightly"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_logs",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("log_bytes", sa.BigInteger(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_logs_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_logs")),
    )


def downgrade() -> None:
    op.drop_table("run_logs")
