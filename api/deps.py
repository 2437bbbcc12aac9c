"""Annotated dependencies: the request's session, app state (settings, celery, clusters), and auth.

Auth: reads are open unless settings.require_read_token; writes need a token (WriteAuth): a `submit` token writes
experiments, suites, imports and regressions; tokens and webhooks need an `admin` token (AdminAuth).

The session is owned by the request: opened here, closed after the response; endpoints commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from celery import Celery
from fastapi import Depends, Header, Path, Query, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.problems import FieldError, ProblemError
from core.contracts.clusters import Cluster
from core.settings import Settings
from db.models import ApiToken
from db.tokens import verify_token

# Dependencies that do no I/O are `async def`: FastAPI runs sync ones in the thread pool, one hop each.


READ_METHODS = ("GET", "HEAD")

# Every id, in a path or a query, has the same bounds: the store's ids are positive 32-bit integers, and a
# larger number is a 422 naming the parameter (SQLite would raise OverflowError binding it: a 500). Every router
# takes its id types from here.
MAX_ID = 2**31 - 1
ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID, description="Experiment id.")]
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="Run id.")]
SuiteId = Annotated[int, Path(ge=1, le=MAX_ID, description="Suite id.")]
RegressionId = Annotated[int, Path(ge=1, le=MAX_ID, description="Regression id.")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="Token id.")]
WebhookId = Annotated[int, Path(ge=1, le=MAX_ID, description="Webhook id.")]
SuiteIdQuery = Annotated[int | None, Query(ge=1, le=MAX_ID, description="Suite id.")]

# Responses shared by the routers.
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: If-None-Match holds the current ETag."}
}


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A Session per request. Reads run in autocommit (no BEGIN/ROLLBACK round trips: each statement sees
    committed data); writes get a transaction that the endpoint commits. Creating a session does no I/O;
    closing it returns the connection to the pool, so that runs in the thread pool."""
    state = request.app.state
    session = (state.read_session_factory if request.method in READ_METHODS else state.session_factory)()
    try:
        yield session
    finally:
        await run_in_threadpool(session.close)


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_celery(request: Request) -> Celery:
    return request.app.state.celery


async def get_clusters(request: Request) -> dict[str, Cluster]:
    return request.app.state.clusters


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
ClustersDep = Annotated[dict[str, Cluster], Depends(get_clusters)]

_BEARER_HEADERS = {"WWW-Authenticate": 'Bearer realm="scalebench"'}


def _unauthorized(message: str) -> ProblemError:
    return ProblemError(
        401,
        message,
        [FieldError(field="header.Authorization", message=message, allowed=["Bearer <token>"])],
        headers=_BEARER_HEADERS,
    )


def _check_bearer(session: Session, authorization: str | None) -> ApiToken:
    if not authorization:
        raise _unauthorized("missing Authorization header (create a token with `scalebench token create`)")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("Authorization must be 'Bearer <token>'")
    row = verify_token(session, token)
    if row is None:
        raise _unauthorized("unknown or revoked token")
    session.commit()  # last_used_at (touched at most once a minute)
    return row


def authenticate(request: Request) -> ApiToken:
    """The request's valid token or a 401 problem, on a session of its own (committed: last_used_at).
    api.guard calls it before the body is read; require_token then finds the token on request.state."""
    with request.app.state.session_factory() as session:
        return _check_bearer(session, request.headers.get("authorization"))


def require_token(
    request: Request,
    session: SessionDep,
    authorization: Annotated[str | None, Header(description="Bearer <token>")] = None,
) -> ApiToken:
    """Writes: a valid `Authorization: Bearer <token>` (already checked by api.guard on guarded routes)."""
    token = getattr(request.state, "token", None)
    return token if token is not None else _check_bearer(session, authorization)


async def read_access(
    session: SessionDep,
    settings: SettingsDep,
    authorization: Annotated[str | None, Header(description="Bearer <token> (when reads require one)")] = None,
) -> ApiToken | None:
    """Reads: open unless settings.require_read_token. (Reads that show a token holder more use `reader`.)"""
    if not settings.require_read_token:
        return None
    return await run_in_threadpool(_check_bearer, session, authorization)


class Reader:
    """Who reads: a token holder sees where runs ran (worker, host, run directory), an anonymous reader does
    not. With open reads the token is looked up only when asked (a 304 poll costs no token query); an
    invalid token on an open read reads as anonymous, as before."""

    def __init__(self, session: Session, authorization: str | None, token: ApiToken | None = None):
        self._session, self._authorization, self._token = session, authorization, token
        self._checked = token is not None or not authorization

    def authenticated(self) -> bool:
        if not self._checked:
            self._checked = True
            try:
                self._token = _check_bearer(self._session, self._authorization)
            except ProblemError:
                self._token = None
        return self._token is not None


async def reader(
    session: SessionDep,
    settings: SettingsDep,
    authorization: Annotated[str | None, Header(description="Bearer <token> (when reads require one)")] = None,
) -> Reader:
    """Reads that show more to a token holder; like read_access when settings.require_read_token."""
    if settings.require_read_token:
        return Reader(session, authorization, await run_in_threadpool(_check_bearer, session, authorization))
    return Reader(session, authorization)


def require_admin(token: Annotated[ApiToken, Depends(require_token)]) -> ApiToken:
    """Tokens and webhooks: a valid token of role admin, else 403 naming the role it needs."""
    if token.role != "admin":
        message = f"this needs an admin token; token {token.id} ({token.name!r}) is {token.role}"
        raise ProblemError(403, message, [FieldError(field="header.Authorization", message=message, allowed=["admin"])])
    return token


WriteAuth = Annotated[ApiToken, Depends(require_token)]
AdminAuth = Annotated[ApiToken, Depends(require_admin)]
ReadAuth = Annotated[ApiToken | None, Depends(read_access)]
ReaderAuth = Annotated[Reader, Depends(reader)]
