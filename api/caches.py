"""The API's per-process caches, created by the app's lifespan (api.app) with their sizes from Settings.

fingerprints  experiment id -> change fingerprint, reused for Settings.etag_ttl_s (api.etag)
answers       ETag -> a whole answer (/scaling JSON, CSV, PNG), Settings.report_cache_size entries
point_values  a scaling point's aggregated values by the point's own fingerprint (db.points)
numerics      an fp8/bf16 pair's loss verdict and matched losses by its runs (core.analysis.scaling.numerics_key)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Response
from sqlalchemy.orm import Session

from core.settings import Settings
from db.points import fingerprints

POINT_CACHE_SIZE = 100_000  # (series, N) points per process, ~300 bytes each
NUMERICS_CACHE_SIZE = 20_000  # fp8/bf16 pairs per process, a few kB each (verdict, matched losses)


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


class AnswerCache:
    """ETag -> (media type, body): a thread-safe LRU. An ETag changes whenever its answer can, so entries
    never go stale; they only age out."""

    def __init__(self, size: int):
        self.size, self._lock, self._items = size, threading.Lock(), OrderedDict[str, tuple[str, bytes]]()

    def answer(self, headers: dict[str, str], build: Callable[[], tuple[str, bytes]]) -> Response:
        key = headers.get("ETag")
        hit = None
        if key and self.size:
            with self._lock:
                hit = self._items.get(key)
                if hit:
                    self._items.move_to_end(key)
        media_type, body = hit or build()
        if key and self.size and not hit:
            with self._lock:
                self._items[key] = (media_type, body)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return Response(body, media_type=media_type, headers=headers)


class LruDict(MutableMapping):
    """A bounded, thread-safe mapping (least recently used out): db.points keeps each scaling point's
    aggregated values in it, keyed by the point's own fingerprint, so entries never go stale either."""

    def __init__(self, size: int):
        self.size, self._lock = size, threading.Lock()
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def __getitem__(self, key: Any) -> Any:
        with self._lock:
            value = self._items[key]
            self._items.move_to_end(key)
            return value

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            del self._items[key]

    def __iter__(self):
        with self._lock:
            return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Caches:
    fingerprints: FingerprintCache
    answers: AnswerCache
    point_values: LruDict
    numerics: LruDict


def make_caches(settings: Settings) -> Caches:
    return Caches(
        FingerprintCache(settings.etag_ttl_s),
        AnswerCache(settings.report_cache_size),
        LruDict(POINT_CACHE_SIZE),
        LruDict(NUMERICS_CACHE_SIZE),
    )
