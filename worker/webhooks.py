"""Webhook sender: POSTs pending deliveries (the outbox rows db.webhooks writes with each finding).

Request: a JSON body (the stored payload plus delivery_id, attempt and timestamp, so the signature also
covers the time it was sent: a receiver can refuse replays older than a few minutes) and headers

  X-Scalebench-Signature: sha256=<hex HMAC-SHA256 of the raw body with the webhook's secret>
  X-Scalebench-Timestamp: <unix seconds, the body's timestamp>
  X-Scalebench-Event, X-Scalebench-Delivery

A 2xx answer delivers it. Anything else (status, timeout, refused connection) is retried with exponential
backoff: BASE_DELAY_S * 2**(attempt-1), capped at MAX_DELAY_S, MAX_ATTEMPTS attempts in all, then the row
is `failed`. Every attempt is logged on the row. Each attempt is claimed first (compare-and-set on
next_attempt_at), so two senders never POST the same attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy.orm import Session, sessionmaker

from db import webhooks as q
from db.models import utcnow
from db.models_nightly import Webhook, WebhookDelivery

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 6
BASE_DELAY_S = 30.0
MAX_DELAY_S = 3600.0
TIMEOUT_S = 10.0
CLAIM_LEASE_S = 120.0  # a sender that died mid-attempt leaves the row to be retried after this
MAX_ERROR_CHARS = 2000
SIGNATURE_HEADER = "X-Scalebench-Signature"
TIMESTAMP_HEADER = "X-Scalebench-Timestamp"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_s(attempt: int) -> float:
    """Delay after failed attempt number `attempt` (1-based)."""
    return min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (attempt - 1))


@dataclass(frozen=True)
class AttemptOutcome:
    delivery_id: int
    attempt: int
    status_code: int | None
    error: str | None
    delivered: bool
    gave_up: bool


def _request(d: WebhookDelivery, hook: Webhook, now: datetime) -> tuple[bytes, dict[str, str]]:
    stamp = int(now.timestamp())
    body = json.dumps({**d.payload, "delivery_id": d.id, "attempt": d.attempt, "timestamp": stamp},
                      sort_keys=True, separators=(",", ":"), default=str).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "scalebench-webhooks/0.1",
               SIGNATURE_HEADER: sign(hook.secret, body), TIMESTAMP_HEADER: str(stamp),
               "X-Scalebench-Event": d.event, "X-Scalebench-Delivery": str(d.id)}
    return body, headers


def _post(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None]:
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}: {response.text[:500]}"


def attempt_delivery(session_factory: sessionmaker[Session], client: httpx.Client, delivery_id: int,
                     seen_next_attempt_at: datetime, now: datetime,
                     max_attempts: int = MAX_ATTEMPTS) -> AttemptOutcome | None:
    """Claim, POST (outside any transaction), record. None when another sender claimed it first."""
    with session_factory() as s:
        if not q.claim_delivery(s, delivery_id, seen_next_attempt_at, now, CLAIM_LEASE_S):
            return None
        s.commit()
        d = s.get(WebhookDelivery, delivery_id)
        assert d is not None
        hook = s.get(Webhook, d.webhook_id)
        assert hook is not None
        body, headers = _request(d, hook, now)
        url, attempt = hook.url, d.attempt
    started = time.monotonic()
    status_code, error = _post(client, url, body, headers)
    duration_ms = (time.monotonic() - started) * 1000
    delivered = error is None
    gave_up = not delivered and attempt >= max_attempts
    retry_at = None if delivered or gave_up else now + timedelta(seconds=backoff_s(attempt))
    with session_factory() as s:
        q.record_attempt(s, delivery_id, now=now, status_code=status_code, error=error, duration_ms=duration_ms,
                         delivered=delivered, retry_at=retry_at)
        s.commit()
    if not delivered:
        (log.error if gave_up else log.warning)("webhook delivery %d to %s, attempt %d: %s%s", delivery_id, url,
                                                attempt, error, " (giving up)" if gave_up else "")
    return AttemptOutcome(delivery_id, attempt, status_code, error, delivered, gave_up)


def deliver_due(session_factory: sessionmaker[Session], now: datetime | None = None,
                client: httpx.Client | None = None, max_attempts: int = MAX_ATTEMPTS) -> list[AttemptOutcome]:
    """One pass: attempt every delivery due at `now`."""
    now = now or utcnow()
    with session_factory() as s:
        due = q.due_deliveries(s, now)
    if not due:
        return []
    own = client is None
    client = client or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        outcomes = [attempt_delivery(session_factory, client, i, seen, now, max_attempts) for i, seen in due]
    finally:
        if own:
            client.close()
    return [o for o in outcomes if o is not None]
