"""runs.num_dispatches (how many messages were published for a run) and an index for claiming in order

Revision ID: 0005_run_order
Revises: 0004_tokens
Create Date: 2026-12-03 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_run_order"
down_revision: str | Sequence[str] | None = "0004_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTERs: a batch table copy of `runs` on SQLite would cascade-delete its summaries and steps.
    op.add_column("runs", sa.Column("num_dispatches", sa.Integer(), server_default="0", nullable=False))
    op.create_index("ix_runs_queue_status_id", "runs", ["queue", "status", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_queue_status_id", table_name="runs")
    op.drop_column("runs", "num_dispatches")  # SQLite >= 3.35 drops a column in place (no table copy)
