"""ETags for what the dashboard polls, so that an unchanged poll costs one small query and a 304.

Experiment-scoped reads (the experiment, its runs, scaling JSON/CSV/PNG, loss curves, compare) take their
ETag from db.analysis.fingerprints (per-status counts and max timestamps of the runs; one query, reused
for DEFAULT_TTL_S by the whole process) plus the request path and query, so a poll is answered before
any report is built, and most polls without touching the database. Other reads (the experiment
list) hash their response body: that saves the transfer and the client's re-render, not the query.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence

from fastapi import Request, Response
from sqlalchemy.orm import Session

from db.analysis import fingerprints

# Bump when a response's shape or its computation changes, so that clients holding old ETags refetch.
ETAG_SALT = "scalebench-analysis-2"  # 2: /losses states its downsampling
NO_CACHE = {"Cache-Control": "no-cache"}  # browsers store but always revalidate
# A fingerprint is reused for this long by every request of the process: a thousand dashboards polling one
# experiment cost one query per second, not a thousand. The price: a change shows up to this much later
# (a poll may get one more 304). 0 turns it off.
DEFAULT_TTL_S = float(os.environ.get("SCALEBENCH_ETAG_TTL_S", "1.0"))


class FingerprintCache:
    """experiment id -> (fingerprint, expiry), shared by the threads of one app; misses go to the database.

    One query per expired id at a time: while one thread refreshes an id, the others answer from its
    expired fingerprint instead of running the same query (at 20,000 runs it costs tens of ms, and a
    hundred pollers arriving together after the expiry would otherwise all run it). A change therefore
    shows up at most ttl_s plus one refresh late."""

    def __init__(self, ttl_s: float):
        self.ttl_s, self._lock, self._items = ttl_s, threading.Lock(), dict[int, tuple[str, float]]()
        self._refreshing: set[int] = set()

    def get(self, session: Session, experiment_ids: Sequence[int]) -> dict[int, str]:
        now = time.monotonic()
        with self._lock:
            fresh, query = {}, []
            for i in experiment_ids:
                v = self._items.get(i)
                if v and (v[1] > now or i in self._refreshing):  # expired and being refreshed: still served
                    fresh[i] = v[0]
                else:
                    query.append(i)
            if self.ttl_s > 0:
                self._refreshing.update(query)
        if not query:
            return fresh
        try:
            found = fingerprints(session, query)
        finally:
            with self._lock:
                self._refreshing.difference_update(query)
        if self.ttl_s > 0:
            with self._lock:
                self._items.update({i: (fp, now + self.ttl_s) for i, fp in found.items()})
                if len(self._items) > 10_000:  # ids polled long ago
                    self._items = {i: v for i, v in self._items.items() if v[1] > now}
        fresh.update(found)
        return fresh


def _fingerprint_cache(request: Request) -> FingerprintCache:
    cache = getattr(request.app.state, "fingerprint_cache", None)
    if cache is None:  # first use in this app (a benign race: two caches, one kept)
        cache = request.app.state.fingerprint_cache = FingerprintCache(
            float(os.environ.get("SCALEBENCH_ETAG_TTL_S", DEFAULT_TTL_S)))
    return cache


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
