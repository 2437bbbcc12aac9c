"""Webhook sender: POSTs pending deliveries (the outbox rows db.webhooks writes with each finding).

Request: a JSON body (the stored payload plus delivery_id, attempt and timestamp, so the signature also
covers the time it was sent: a receiver can refuse replays older than a few minutes) and headers

  X-Scalebench-Signature: sha256=<hex HMAC-SHA256 of the raw body with the webhook's secret>
  X-Scalebench-Timestamp: <unix seconds, the body's timestamp>
  X-Scalebench-Event, X-Scalebench-Delivery

A 2xx answer delivers it. Anything else (status, a redirect, timeout, refused connection, a target the
guard refuses) is retried with exponential backoff: BASE_DELAY_S * 2**(attempt-1), capped at MAX_DELAY_S,
MAX_ATTEMPTS attempts in all, then the row is `failed`. Every attempt is logged on the row with a short status
line only ("HTTP 503 Service Unavailable", "ConnectError", "refused: ..."): never the receiver's body nor a
socket error's text. Each attempt is claimed first (compare-and-set on next_attempt_at), so two senders never
POST the same attempt. A webhook disabled meanwhile ends the delivery as failed ("webhook disabled").

Every attempt resolves the URL's host, checks every address and connects to the checked one
(core.contracts.webhook_targets.pin: public addresses only unless SCALEBENCH_WEBHOOK_ALLOW_PRIVATE=1; no proxy from
the environment, no redirects followed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker

import db.webhooks
from core.contracts.webhook_targets import Resolver, TargetRefused, pin
from db.base import utcnow
from db.models import Webhook, WebhookDelivery
from osutil.dns import system_resolve

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 6
BASE_DELAY_S = 30.0
MAX_DELAY_S = 3600.0
TIMEOUT_S = 10.0
CLAIM_LEASE_S = 120.0  # a sender that died mid-attempt leaves the row to be retried after this
MAX_ERROR_CHARS = 200  # a status line, not a body: the log is no window into what answered
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
    body = json.dumps(
        {**d.payload, "delivery_id": d.id, "attempt": d.attempt, "timestamp": stamp},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "scalebench-webhooks/0.1",
        SIGNATURE_HEADER: sign(hook.secret, body),
        TIMESTAMP_HEADER: str(stamp),
        "X-Scalebench-Event": d.event,
        "X-Scalebench-Delivery": str(d.id),
    }
    return body, headers


def _post(
    client: httpx.Client, url: str, body: bytes, headers: dict[str, str], *, allow_private: bool, resolve: Resolver
) -> tuple[int | None, str | None]:
    """POST to the checked address of `url`; (status code, None) when delivered, else a short status line."""
    try:
        target = pin(url, allow_private=allow_private, resolve=resolve)
    except TargetRefused as exc:
        return None, f"refused: {exc.reason}"[:MAX_ERROR_CHARS]
    extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    try:
        response = client.post(
            target.connect_url, content=body, headers={**headers, "Host": target.host_header}, extensions=extensions
        )
    except httpx.HTTPError as exc:
        return None, type(exc).__name__  # the class only: the text of a socket error says what listens there
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code} {response.reason_phrase}"[:MAX_ERROR_CHARS]


def make_client() -> httpx.Client:
    """No redirects followed, no proxy taken from the environment (the request goes to the checked address)."""
    return httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)


def attempt_delivery(
    session_factory: sessionmaker[Session],
    client: httpx.Client,
    delivery_id: int,
    seen_next_attempt_at: datetime,
    now: datetime,
    max_attempts: int = MAX_ATTEMPTS,
    *,
    allow_private: bool = False,
    resolve: Resolver = system_resolve,
) -> AttemptOutcome | None:
    """Claim, POST (outside any transaction), record. None when another sender claimed it first."""
    with session_factory() as s:
        if not db.webhooks.claim_delivery(s, delivery_id, seen_next_attempt_at, now, CLAIM_LEASE_S):
            return None
        s.commit()
        d = s.get(WebhookDelivery, delivery_id)
        hook = s.get(Webhook, d.webhook_id) if d is not None else None
        if d is None or hook is None:  # deleted since it was listed
            return None
        body, headers = _request(d, hook, now)
        url, attempt, enabled = hook.url, d.attempt, hook.enabled
    started = time.monotonic()
    if enabled:
        status_code, error = _post(client, url, body, headers, allow_private=allow_private, resolve=resolve)
    else:
        status_code, error = None, "webhook disabled"
    duration_ms = (time.monotonic() - started) * 1000
    delivered = error is None
    gave_up = not delivered and (attempt >= max_attempts or not enabled)
    retry_at = None if delivered or gave_up else now + timedelta(seconds=backoff_s(attempt))
    with session_factory() as s:
        db.webhooks.record_attempt(
            s,
            delivery_id,
            now=now,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
            delivered=delivered,
            retry_at=retry_at,
        )
        s.commit()
    if not delivered:
        (log.error if gave_up else log.warning)(
            "webhook delivery %d to %s, attempt %d: %s%s",
            delivery_id,
            urlsplit(url).hostname,
            attempt,
            error,
            " (giving up)" if gave_up else "",
        )
    return AttemptOutcome(delivery_id, attempt, status_code, error, delivered, gave_up)


def deliver_due(
    session_factory: sessionmaker[Session],
    now: datetime | None = None,
    client: httpx.Client | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    *,
    allow_private: bool = False,
    resolve: Resolver = system_resolve,
) -> list[AttemptOutcome]:
    """One pass: attempt every delivery due at `now`. allow_private: the operator allows receivers on private
    networks (SCALEBENCH_WEBHOOK_ALLOW_PRIVATE); resolve: host -> addresses (the system resolver)."""
    now = now or utcnow()
    with session_factory() as s:
        due = db.webhooks.due_deliveries(s, now)
    if not due:
        return []
    own = client is None
    client = client or make_client()
    try:
        outcomes = [
            attempt_delivery(
                session_factory, client, i, seen, now, max_attempts, allow_private=allow_private, resolve=resolve
            )
            for i, seen in due
        ]
    finally:
        if own:
            client.close()
    return [o for o in outcomes if o is not None]
