"""API tokens (only the sha256 of a token is stored)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, enum_check, utcnow

# Roles, lowest first: `submit` writes experiments, suites, imports and regressions; `admin` also manages tokens
# and webhooks (where the service sends data). Tokens made before roles existed are admin (migration 0013).
TOKEN_ROLES: tuple[str, ...] = ("submit", "admin")


class ApiToken(Base):
    """Only the sha256 of a token is stored, with its first characters to tell tokens apart in a list."""

    __tablename__ = "api_tokens"
    __table_args__ = (enum_check("role", TOKEN_ROLES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)  # sha256 hex of the token
    prefix: Mapped[str | None] = mapped_column(sa.String(16))  # None for tokens made before prefixes were kept
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]  # a revoked token authenticates nothing
    role: Mapped[str] = mapped_column(sa.String(16), server_default="admin")  # TOKEN_ROLES
