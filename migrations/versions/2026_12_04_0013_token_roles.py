"""token roles: api_tokens.role (submit | admin); every existing token becomes admin

Before roles every token could do everything (create and revoke tokens, manage webhooks), so existing tokens
keep that as `admin`; tokens made through POST /tokens are `submit` unless asked otherwise. Idempotency-Keys
are scoped per token from now on (the API stores a token's key as t<token id>:<sha256>); earlier keys stay
stored as they were and no longer match a new request, which only makes a repeat create a new experiment.

Revision ID: 0013_token_roles
Revises: 0012_curve_digests
Create Date: 2026-12-04 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_token_roles"
down_revision: str | Sequence[str] | None = "0012_curve_digests"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLE_CHECK = "role IN ('submit', 'admin')"


def upgrade() -> None:
    # A plain ADD COLUMN (as 0009): SQLite takes the CHECK inline with the column; PostgreSQL as a named constraint.
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE api_tokens ADD COLUMN role VARCHAR(16) DEFAULT 'admin' NOT NULL "
            f"CONSTRAINT ck_api_tokens_role_allowed CHECK ({_ROLE_CHECK})"
        )
    else:
        op.add_column("api_tokens", sa.Column("role", sa.String(length=16), server_default="admin", nullable=False))
        op.create_check_constraint(op.f("ck_api_tokens_role_allowed"), "api_tokens", _ROLE_CHECK)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint(op.f("ck_api_tokens_role_allowed"), "api_tokens", type_="check")
    op.drop_column("api_tokens", "role")  # SQLite >= 3.35 drops a column in place (no table copy)
