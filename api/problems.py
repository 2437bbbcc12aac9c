"""Every error is application/problem+json (RFC 9457) with `errors: [{field, message, allowed?}]`.

One place maps request validation errors, HTTP errors, domain errors and unexpected exceptions to problems.
"""

from __future__ import annotations

import logging
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.contracts.specs import LAYOUT_FORMS

log = logging.getLogger(__name__)
PROBLEM_TYPE = "application/problem+json"
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class FieldError(BaseModel):
    field: str = Field(
        description="Path of the failing field, e.g. `gpu_counts[0]`, `query.limit`, `header.Authorization`."
    )
    message: str
    allowed: list[Any] | None = Field(None, description="Allowed values, when the set is finite.")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] = []


class ProblemError(Exception):
    """A domain error the API turns into a problem response."""

    def __init__(
        self,
        status: int,
        detail: str,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []
        self.headers, self.extra = headers, extra


def problem_response(
    request: Request,
    status: int,
    detail: str | None,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = Problem(
        title=TITLES.get(status, "Error"), status=status, detail=detail, instance=request.url.path, errors=errors or []
    ).model_dump(mode="json")
    return JSONResponse(body | extra, status_code=status, headers=headers, media_type=PROBLEM_TYPE)


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": TITLES[code], "content": {PROBLEM_TYPE: {}}}
    for code in (401, 404, 409, 422)
}
# Writes (api.guard): a body too large, not JSON, or over the token's write rate.
WRITE_RESPONSES: dict[int | str, dict[str, Any]] = PROBLEM_RESPONSES | {
    code: {"model": Problem, "description": TITLES[code], "content": {PROBLEM_TYPE: {}}} for code in (413, 415, 429)
}


T = typing.TypeVar("T")


def found(obj: T | None, what: str, ident: int) -> T:
    """`obj`, or a 404 problem saying which `what` does not exist (the one home of that answer)."""
    if obj is None:
        raise ProblemError(404, f"{what} {ident} does not exist")
    return obj


# ------------------------------------------------------------------------------ validation error mapping

_EXPECTED_RE = re.compile(r"'([^']*)'")


def _field_path(loc: tuple[Any, ...]) -> str:
    """('body', 'gpu_counts', 0) -> 'gpu_counts[0]'; ('query', 'limit') -> 'query.limit'."""
    parts = list(loc)
    prefix = ""
    if parts and parts[0] in ("query", "path", "header", "cookie"):
        prefix = f"{parts.pop(0)}."
    elif parts and parts[0] == "body":
        parts.pop(0)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return prefix + (out or "body")


def _model_at(model: Any, path: tuple[Any, ...]) -> Any:
    """The pydantic model that holds the last key of `path`, walking nested models (lists skipped)."""
    for key in path:
        if isinstance(key, int):
            continue
        field = getattr(model, "model_fields", {}).get(key)
        if field is None:
            return None
        model = field.annotation
        for arg in typing.get_args(model) or ():  # list[X], X | None
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _body_model(request: Request | None) -> Any:
    route = request.scope.get("route") if request is not None else None
    params = getattr(getattr(route, "dependant", None), "body_params", None) or []
    if len(params) != 1:
        return None
    return getattr(params[0].field_info, "annotation", None)


def _allowed(err: Mapping[str, Any], body_model: Any = None) -> list[Any] | None:
    kind, ctx = err.get("type", ""), err.get("ctx") or {}
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return _EXPECTED_RE.findall(str(ctx["expected"])) or None
    loc = tuple(err.get("loc", ("",)))
    if kind == "extra_forbidden" and loc[0] == "body":
        model = _model_at(body_model, loc[1:-1]) if body_model is not None else None
        return sorted(model.model_fields) if model is not None else None
    if "layout" in str(err.get("msg", "")) and LAYOUT_FORMS in str(err.get("msg", "")):
        return ["fsdp", "ddp", "hsdp:shard=S", "tp=T", "tp=T+fsdp"]
    return None


_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _non_finite(value: Any) -> bool:
    """NaN or an infinity, as a float or as the text of one (a query's 'nan', 'inf', '1e400')."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and not math.isfinite(value)


def _message(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") in _BOUND_ERRORS and _non_finite(err.get("input")):
        # NaN compares false with every bound: pydantic names whichever bound it checked, not what is wrong
        return f"must be a finite number, not {str(err.get('input'))[:40]!r}"
    if err.get("type") == "json_invalid":
        loc = err.get("loc", ())
        return f"{msg} at character {loc[-1]}" if loc and isinstance(loc[-1], int) else msg
    return msg


def validation_errors(errors: Sequence[Mapping[str, Any]], body_model: Any = None) -> list[FieldError]:
    """Pydantic errors as FieldErrors; `body_model` (the route's body type) names the fields an unknown one
    could have been."""
    return [
        FieldError(
            field="body" if e.get("type") == "json_invalid" else _field_path(tuple(e.get("loc", ()))),
            message=_message(e),
            allowed=_allowed(e, body_model),
        )
        for e in errors
    ]


# ------------------------------------------------------------------------------------------- handlers


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(
        exc, RequestValidationError
    )  # registered for it (Starlette types every handler's exception as Exception)
    errors = validation_errors(list(exc.errors()), _body_model(request))
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors[:5])
    return problem_response(request, 422, f"invalid request: {detail}", errors)


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(
        exc, StarletteHTTPException
    )  # registered for it (Starlette types every handler's exception as Exception)
    return problem_response(request, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)  # registered for it (Starlette types every handler's exception as Exception)
    return problem_response(request, exc.status, exc.detail, exc.errors, exc.headers, **exc.extra)


async def _on_data_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DataError)  # registered for it (Starlette types every handler's exception as Exception)
    # The database refused a value the validators let through: a client error, but also a gap to close.
    log.warning("database refused a value on %s: %s", request.url.path, exc.orig)
    return problem_response(request, 422, f"the database refused a value: {type(exc.orig).__name__}")


# OperationalError covers both an unreachable database and statements the database could not run on the
# data it holds (SQLite: "malformed JSON"). Only the first is an outage (503, retry); the second is a data error.
_PG_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "53", "57P")  # connection, resources, shutdown / cannot connect now
_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o", "disk is full", "readonly")


def is_unavailable(exc: OperationalError) -> bool:
    """True when the database could not be reached or used at all (not when it refused the data)."""
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if type(exc.orig).__module__.startswith("psycopg"):
        return sqlstate is None or sqlstate.startswith(_PG_UNAVAILABLE_SQLSTATE_PREFIXES)
    message = str(exc.orig).lower()
    return any(marker in message for marker in _SQLITE_UNAVAILABLE)


async def _on_db_down(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(
        exc, OperationalError
    )  # registered for it (Starlette types every handler's exception as Exception)
    if not is_unavailable(exc):
        log.error("data error on %s %s: %s", request.method, request.url.path, exc.orig)
        return problem_response(request, 500, f"the store holds a value this request cannot read: {exc.orig}")
    log.error("database unavailable on %s: %s", request.url.path, exc.orig)
    return problem_response(request, 503, "database unavailable", headers={"Retry-After": "5"})


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(request, 500, f"internal error: {type(exc).__name__}")


class UnexpectedErrors:
    """Pure ASGI middleware: an exception no handler took becomes the 500 problem, and the keep-alive connection
    stays usable. (A handler registered for Exception runs in Starlette's ServerErrorMiddleware, which raises the
    exception again after answering; uvicorn then drops the connection, and the client's next request on it got
    a TCP reset.) An exception after the response started cannot be answered: it propagates."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            response = await _on_unexpected(Request(scope), exc)
            await response(scope, receive, send)


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(DataError, _on_data_error)
    app.add_exception_handler(OperationalError, _on_db_down)
    app.add_middleware(UnexpectedErrors)


def data_path_problem(exc: Exception, data_roots: list[str], field: str = "data_path") -> ProblemError:
    """422 naming data_path: the same answer for every path that is not allowed (no existence oracle)."""
    allowed = [f"a regular file relative to {root}" for root in data_roots] or ["null (the synthetic stream)"]
    return ProblemError(422, str(exc), [FieldError(field=field, message=str(exc), allowed=allowed)])
