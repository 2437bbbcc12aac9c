"""API tokens (only the sha256 of a token is stored)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, utcnow


class ApiToken(Base):
    """Only the sha256 of a token is stored, with its first characters to tell tokens apart in a list."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)  # sha256 hex of the token
    prefix: Mapped[str | None] = mapped_column(sa.String(16))  # None for tokens made before prefixes were kept
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]  # a revoked token authenticates nothing
