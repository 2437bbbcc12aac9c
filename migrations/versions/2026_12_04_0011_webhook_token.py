"""webhook token: which token created each webhook, so that webhooks per token can be capped

webhooks.token_id (nullable, indexed, no foreign key: a revoked token's webhooks stay as they are) is set at
creation; db.webhooks.create_webhook refuses a token's webhook past MAX_WEBHOOKS_PER_TOKEN. Existing webhooks
have no token and count against none.

Revision ID: 0011_webhook_token
Revises: 0010_run_lease_id
Create Date: 2026-12-04 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_webhook_token"
down_revision: str | Sequence[str] | None = "0010_run_lease_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("webhooks", sa.Column("token_id", sa.Integer(), nullable=True))
    op.create_index(op.f("ix_webhooks_token_id"), "webhooks", ["token_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_webhooks_token_id"), table_name="webhooks")
    op.drop_column("webhooks", "token_id")  # SQLite >= 3.35 drops a column in place (no table copy)
