"""run lease id: the fence of a worker's writes about a run

runs.lease_id is incremented by every claim (db.runs.claim_run, a re-attaching one too); a worker names the
lease it was given in every later write (heartbeat, launch details, log, trace, result, requeue) and the store
refuses the write once the run has moved on (reaped, requeued, claimed again). Existing runs start at 0.

Revision ID: 0010_run_lease_id
Revises: 0009_hardening
Create Date: 2026-12-04 16:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_run_lease_id"
down_revision: str | Sequence[str] | None = "0009_hardening"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN on both databases (a batch copy of `runs` on SQLite would cascade-delete its rows'
    # children).
    op.add_column("runs", sa.Column("lease_id", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("runs", "lease_id")  # SQLite >= 3.35 drops a column in place (no table copy)
