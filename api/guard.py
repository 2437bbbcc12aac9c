"""What every route does before FastAPI parses a request body: authenticate writes, rate-limit them per
token, check the Content-Type and the body size.

Order (cheapest refusal first, and nothing of the body is read or parsed before auth):
  401  a write without a valid token (invalid JSON without a token is a 401, not a 422)
  429  the token spent its write budget (a token bucket per token; Retry-After says when to come back)
  415  a body that is not application/json (or +json) on a JSON endpoint
  413  a body above the limit: refused on Content-Length before reading, else while counting streamed bytes
  422  a body the JSON parser refuses for a reason other than its syntax (an integer of more digits than Python
       converts, bytes that are not UTF-8, nesting deeper than the parser recurses); FastAPI would answer those
       400 with no field. A syntax error is left to FastAPI's 422 ("JSON decode error at character N").

Routers use it with `APIRouter(route_class=GuardedRoute)`. The verified token is left on request.state for
api.deps.require_token, so a write costs one token lookup.
"""

from __future__ import annotations

import email.message
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from api.deps import READ_METHODS, authenticate, require_token
from api.problems import FieldError, ProblemError
from core.settings import Settings

LARGE_BODY_PATHS = ("/experiments/import", "/experiments/import/logs")  # bodies up to max_import_body_bytes
JSON_TYPES = ["application/json", "application/*+json"]


def _uses(dependant: Dependant, call: Callable[..., Any]) -> bool:
    return dependant.call is call or any(_uses(d, call) for d in dependant.dependencies)


class RateLimiter:
    """Token buckets, one per API token: `burst` writes at once, refilled at `rate_per_min`. Per process."""

    def __init__(self, rate_per_min: float, burst: int):
        self.rate_per_s, self.burst = rate_per_min / 60.0, max(1, burst)
        self._lock = threading.Lock()
        self._buckets: dict[int, tuple[float, float]] = {}  # token id -> (level, monotonic time of level)

    def take(self, key: int, now: float | None = None) -> float:
        """0 when a write may go ahead (and it is counted), else the seconds until the next one may."""
        now = time.monotonic() if now is None else now
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate_per_s)
            if level >= 1.0:
                self._buckets[key] = (level - 1.0, now)
                return 0.0
            self._buckets[key] = (level, now)
            return (1.0 - level) / self.rate_per_s


def _limiter(request: Request, settings: Settings) -> RateLimiter | None:
    if settings.write_rate_per_min <= 0:
        return None
    limiter = getattr(request.app.state, "write_limiter", None)
    if limiter is None:  # one per app; created on first use (a benign race)
        limiter = request.app.state.write_limiter = RateLimiter(settings.write_rate_per_min, settings.write_burst)
    return limiter


def _rate_limit(request: Request, settings: Settings, token_id: int) -> None:
    limiter = _limiter(request, settings)
    wait_s = limiter.take(token_id) if limiter is not None else 0.0
    if wait_s > 0:
        retry_after_s = max(1, math.ceil(wait_s))
        message = (
            f"more than {settings.write_rate_per_min:g} writes per minute (burst {settings.write_burst}) "
            f"with this token; retry after {retry_after_s} s"
        )
        raise ProblemError(
            429,
            message,
            [FieldError(field="header.Authorization", message=message)],
            headers={"Retry-After": str(retry_after_s)},
        )


def _check_content_type(request: Request) -> None:
    value = request.headers.get("content-type")
    if value:
        message = email.message.Message()
        message["content-type"] = value
        subtype = message.get_content_subtype()
        if message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json")):
            return
    got = f"Content-Type {value!r}" if value else "no Content-Type"
    raise ProblemError(
        415,
        f"send the body as JSON with Content-Type: application/json ({got} was sent)",
        [FieldError(field="header.Content-Type", message=f"{got}; send application/json", allowed=JSON_TYPES)],
    )


def _has_content(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length.strip() not in ("", "0"))


def _too_large(limit_bytes: int, what: str) -> ProblemError:
    message = f"the request body {what}; the limit is {limit_bytes} bytes"
    return ProblemError(413, message, [FieldError(field="body", message=message)])


async def _read_body(request: Request, limit_bytes: int) -> None:
    """The body, counted as it streams; 413 as soon as it passes the limit (the rest is never read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes, f"is {int(declared)} bytes (Content-Length)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise _too_large(limit_bytes, "(chunked) went past the limit and was cut off there")
        chunks.append(chunk)
    request._body = b"".join(chunks)  # Starlette's cache of request.body(): FastAPI parses it, not the stream


def _not_json(reason: str) -> ProblemError:
    message = f"not valid JSON: {reason}"
    return ProblemError(422, f"invalid request: body: {message}", [FieldError(field="body", message=message)])


def _parse_body(request: Request) -> None:
    """Parse the body once, into Starlette's cache of request.json() (what FastAPI then validates)."""
    body = request._body
    if not body:
        return
    try:
        request._json = json.loads(body)
    except json.JSONDecodeError:
        return  # FastAPI answers it, naming the character
    except UnicodeDecodeError as exc:
        where = f"byte {exc.object[exc.start]:#04x} at offset {exc.start}"
        raise _not_json(f"not {exc.encoding.upper()} text: {where} ({exc.reason})") from None
    except RecursionError:
        raise _not_json("arrays or objects nested too deeply") from None
    except ValueError as exc:  # int() refuses more digits than sys.get_int_max_str_digits()
        digits = sys.get_int_max_str_digits()
        huge = "integer string conversion" in str(exc)
        raise _not_json(f"an integer of more than {digits} digits" if huge else str(exc)[:200]) from None


class GuardedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        needs_token = _uses(self.dependant, require_token)
        has_body = self.body_field is not None
        large = self.path_format.endswith(LARGE_BODY_PATHS)

        async def guarded(request: Request) -> Response:
            settings: Settings = request.app.state.settings
            if needs_token:
                token = await run_in_threadpool(authenticate, request)
                request.state.token = token
                if request.method not in READ_METHODS:
                    _rate_limit(request, settings, token.id)
            if has_body:
                if _has_content(request):
                    _check_content_type(request)
                await _read_body(request, settings.max_import_body_bytes if large else settings.max_body_bytes)
                _parse_body(request)
            return await handler(request)

        return guarded
