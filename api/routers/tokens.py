"""API tokens: list (name, prefix, created, last used; never the token nor its hash), create, revoke.

Listing and creating need an admin token: the first one is made on the server (`python -m db.admin create-token`,
admin). Any token may revoke one of its own role or lower (its own too), never one of a higher role (403). A
revoked token gets 401 from then on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

import db.tokens
from api.deps import AdminAuth, SessionDep, TokenId, WriteAuth
from api.guard import GuardedRoute
from api.problems import WRITE_RESPONSES, FieldError, ProblemError, found
from core.contracts.specs import Text
from db.models import ApiToken

router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=GuardedRoute)
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text = Field(
        "default",
        min_length=1,
        max_length=200,
        pattern=NO_CONTROL_CHARS,
        description="A label: who or what uses the token.",
    )
    role: Literal["submit", "admin"] = Field(
        "submit",
        description="submit: experiments, suites, imports, regressions; admin: also tokens and webhooks.",
    )


class TokenRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    prefix: str | None = Field(
        description="The token's first characters (null for tokens made before prefixes were kept)."
    )
    created_at: datetime
    last_used_at: datetime | None = Field(description="Resolution: one minute.")
    revoked_at: datetime | None = None
    role: str = Field(description="submit or admin.")


class TokenCreated(TokenRead):
    token: str = Field(description="Shown only in this response; only its sha256 is stored.")


@router.get(
    "",
    response_model=list[TokenRead],
    responses=WRITE_RESPONSES,
    summary="Tokens that still authenticate (name, prefix, created, last used)",
)
def list_tokens(session: SessionDep, _auth: AdminAuth) -> Any:
    return db.tokens.list_tokens(session)


@router.post(
    "", status_code=201, response_model=TokenCreated, responses=WRITE_RESPONSES, summary="Create a token (shown once)"
)
def create_token(body: TokenCreate, session: SessionDep, _auth: AdminAuth, response: Response) -> Any:
    token, row = db.tokens.create_token(session, body.name, body.role)
    session.commit()
    response.headers["Location"] = f"/tokens/{row.id}"
    return TokenRead.model_validate(row).model_dump() | {"token": token}


@router.delete(
    "/{token_id}",
    response_model=TokenRead,
    responses=WRITE_RESPONSES,
    summary="Revoke a token: it gets 401 from then on (admin: any token; submit: only itself; again: no change)",
)
def revoke_token(token_id: TokenId, session: SessionDep, auth: WriteAuth) -> ApiToken:
    try:
        revoked = db.tokens.revoke_token(session, token_id, by=auth)
    except db.tokens.RoleError as exc:
        raise ProblemError(403, str(exc), [FieldError(field="token_id", message=str(exc), allowed=[auth.id])]) from exc
    row = found(revoked, "token", token_id)
    session.commit()
    return row
