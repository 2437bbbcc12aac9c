"""runs.num_dispatches (how many messages were published for a run) and an index for claiming in order

Revision ID: 0005_run_order
Revises: 0004_tokens
Create Date: 2026-12-03 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005_run_order'
down_revision: str | Sequence[str] | None = '0004_tokens'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('num_dispatches', sa.Integer(), server_default='0', nullable=False))
        batch.create_index('ix_runs_queue_status_id', ['queue', 'status', 'id'])


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_index('ix_runs_queue_status_id')
        batch.drop_column('num_dispatches')
