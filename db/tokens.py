"""API tokens: only the sha256 of a token is stored; the plain token is shown once, at creation."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import ApiToken, utcnow

TOKEN_PREFIX = "sb_"
LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid one extra write per request


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str = "default") -> tuple[str, ApiToken]:
    """A new random token (returned in plain text once) and its stored row (hash only)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=hash_token(token), created_at=utcnow())
    session.add(row)
    session.flush()
    return token, row


def verify_token(session: Session, token: str) -> ApiToken | None:
    """The token's row when it exists (and touch last_used_at at most once a minute), else None."""
    row = session.scalars(sa.select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is not None:
        now = utcnow()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            row.last_used_at = now
    return row
