"""API tokens: only the sha256 of a token is stored; the plain token is shown once, at creation. A token
is listed by name and prefix (its first characters) and revoked by id; a revoked token authenticates nothing.
Each has a role (db.models.TOKEN_ROLES, lowest first): `submit` or `admin`; a token cannot revoke one of a
higher role. Functions never commit.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.base import utcnow
from db.models import TOKEN_ROLES, ApiToken

TOKEN_PREFIX = "sb_"
PREFIX_CHARS = 11  # "sb_" and 8 random characters: enough to tell tokens apart, far too few to guess one
LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid one extra write per request


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


class RoleError(ValueError):
    """A token may not do this to another of a higher role."""


def role_rank(role: str) -> int:
    return TOKEN_ROLES.index(role) if role in TOKEN_ROLES else -1


def create_token(session: Session, name: str = "default", role: str = "submit") -> tuple[str, ApiToken]:
    """A new random token (returned in plain text once) and its stored row (hash and prefix only)."""
    if role not in TOKEN_ROLES:
        raise ValueError(f"role {role!r} is not one of: {', '.join(TOKEN_ROLES)}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, token_hash=hash_token(token), prefix=token[:PREFIX_CHARS], created_at=utcnow(), role=role)
    session.add(row)
    session.flush()
    return token, row


def verify_token(session: Session, token: str) -> ApiToken | None:
    """The token's row when it exists and is not revoked (and touch last_used_at at most once a minute)."""
    row = session.scalars(
        sa.select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    if row is not None:
        now = utcnow()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            row.last_used_at = now
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    """Tokens that still authenticate, oldest first."""
    return list(session.scalars(sa.select(ApiToken).where(ApiToken.revoked_at.is_(None)).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int, by: ApiToken | None = None) -> ApiToken | None:
    """Revoke a token; None when no token has that id; an already revoked one is returned as it is (revoking is
    idempotent). RoleError when `by` (the token asking; None: the operator on the server) may not: an admin
    token revokes any token, a submit token only itself (tokens are an admin's to manage)."""
    row = session.get(ApiToken, token_id)
    if row is None:
        return None
    if by is not None and by.role != "admin" and row.id != by.id:
        raise RoleError(f"a {by.role} token can revoke only itself, not token {token_id}; ask an admin")
    if row.revoked_at is not None:
        return row
    row.revoked_at = utcnow()
    session.flush()
    return row
