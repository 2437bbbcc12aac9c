"""ETags for what the dashboard polls, so that an unchanged poll costs one small query and a 304.

Experiment-scoped reads (the experiment, its runs, scaling JSON/CSV/PNG, loss curves, compare) take their
ETag from db.points.fingerprints (per-status counts and max timestamps of the runs; one query, reused
for Settings.etag_ttl_s by the whole process, api.caches) plus the request path and query, so a poll is answered before
any report is built, and most polls without touching the database. Other reads (the experiment
list) hash their response body: that saves the transfer and the client's re-render, not the query.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from fastapi import Request, Response
from sqlalchemy.orm import Session

from api.caches import FingerprintCache

# Bump when a response's shape or its computation changes, so that clients holding old ETags refetch.
ETAG_SALT = "scalebench-analysis-3"  # 2: /losses states its downsampling; 3: /losses serves every seed
NO_CACHE = {"Cache-Control": "no-cache"}  # browsers store but always revalidate


def _fingerprint_cache(request: Request) -> FingerprintCache:
    return request.app.state.caches.fingerprints


def _quoted(*parts: str) -> str:
    digest = hashlib.blake2b("\x1f".join((ETAG_SALT, *parts)).encode(), digest_size=12).hexdigest()
    return f'"{digest}"'


def matches(request: Request, etag: str) -> bool:
    """If-None-Match holds this ETag (weak comparison, lists and `*` understood)."""
    header = request.headers.get("if-none-match")
    if not header:
        return False
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return "*" in tags or etag in tags


def not_modified(etag: str) -> Response:
    return Response(status_code=304, headers={"ETag": etag, **NO_CACHE})


def _request_variant(request: Request) -> str:
    return f"{request.url.path}?{'&'.join(sorted(request.url.query.split('&')))}"


def experiments_etag(request: Request, session: Session, experiment_ids: Sequence[int]) -> str | None:
    """ETag of a read over these experiments; None when one of them does not exist."""
    fps = _fingerprint_cache(request).get(session, experiment_ids)
    if len(fps) < len(set(experiment_ids)):
        return None
    return _quoted(_request_variant(request), *(f"{i}:{fps[i]}" for i in experiment_ids))


def check(request: Request, session: Session, experiment_ids: Sequence[int]) -> tuple[dict[str, str], Response | None]:
    """(headers for the full answer, a 304 to return now or None).

    A missing experiment gives ({}, None): the endpoint goes on to its own 404. FastAPI drops the headers
    of an injected `response` when an endpoint returns a Response itself, so callers attach these.
    """
    etag = experiments_etag(request, session, experiment_ids)
    if etag is None:
        return {}, None
    if matches(request, etag):
        return {}, not_modified(etag)
    return {"ETag": etag, **NO_CACHE}, None


def body_etag(request: Request, body: bytes) -> str:
    return _quoted(_request_variant(request), hashlib.blake2b(body, digest_size=16).hexdigest())
