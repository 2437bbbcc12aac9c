"""curve digests: run_loss_curves.digest_f64, each run's curves reduced once for the loss verdict and time to loss

The loss verdict and time to the same loss read a compact digest of each run's curves (core.analysis.curves:
training loss in at most 64 bins, held-out loss point by point) instead of every stored curve on each read.
Rows stored before this revision keep NULL: the readers digest them from the stored curve when they need them.

Revision ID: 0012_curve_digests
Revises: 0011_webhook_token
Create Date: 2026-12-04 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_curve_digests"
down_revision: str | Sequence[str] | None = "0011_webhook_token"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("run_loss_curves", sa.Column("digest_f64", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_loss_curves") as batch:
        batch.drop_column("digest_f64")
