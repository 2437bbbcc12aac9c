"""Webhooks and their delivery outbox. A finding that should notify inserts one delivery row per enabled,
subscribed webhook in the same transaction as the finding (so a notification is never lost nor sent for
a finding that rolled back); worker/webhooks.py sends them. Functions never commit.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.contracts.webhook_targets import Resolver, TargetRefused
from core.contracts.webhook_targets import check_url as check_target
from db.base import utcnow
from db.models import DEFAULT_WEBHOOK_EVENTS, WEBHOOK_EVENTS, ApiToken, Webhook, WebhookDelivery
from db.session import rowcount

MIN_SECRET_CHARS = 16
MAX_WEBHOOKS_PER_TOKEN = 20  # each webhook costs the scheduler's sender time: no token can make it unbounded


class WebhookError(ValueError):
    def __init__(self, field: str, message: str, allowed: list[Any] | None = None):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.allowed = field, message, allowed


URL_FORMS = ["https://host/path", "http://host/path (public addresses only)"]


def check_url(url: str, *, allow_private: bool = False, resolve: Resolver | None = None) -> str:
    """A webhook URL the sender may POST to (core.contracts.webhook_targets: public addresses, no credentials)."""
    try:
        check_target(url, allow_private=allow_private, resolve=resolve)
    except TargetRefused as exc:
        raise WebhookError("url", exc.reason, URL_FORMS) from None
    return url


def check_events(events: Sequence[str]) -> list[str]:
    for e in events:
        if e not in WEBHOOK_EVENTS:
            raise WebhookError("events", f"unknown event {e!r}", list(WEBHOOK_EVENTS))
    if not events:
        raise WebhookError("events", "at least one event is needed", list(WEBHOOK_EVENTS))
    return list(dict.fromkeys(events))


def create_webhook(
    session: Session,
    url: str,
    *,
    secret: str | None = None,
    events: Sequence[str] | None = None,
    enabled: bool = True,
    now: datetime | None = None,
    allow_private: bool = False,
    resolve: Resolver | None = None,
    token_id: int | None = None,
    max_per_token: int = MAX_WEBHOOKS_PER_TOKEN,
) -> Webhook:
    """A webhook; without a secret one is generated (returned once by the API, then never shown).
    allow_private: the operator allows receivers on private networks; resolve: check the name's addresses too.
    token_id: the token creating it, which may own at most `max_per_token` webhooks (counted under the token's
    row lock, so concurrent creations cannot pass the cap)."""
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        raise WebhookError("secret", f"must have at least {MIN_SECRET_CHARS} characters")
    if token_id is not None:
        _lock_token(session, token_id)
        count = sa.select(sa.func.count()).select_from(Webhook).where(Webhook.token_id == token_id)
        owned = session.scalar(count) or 0
        if owned >= max_per_token:
            raise WebhookError(
                "url",
                f"this token already owns {owned} webhooks: the cap is {max_per_token} webhooks per token; "
                "delete one (DELETE /webhooks/{id}) before adding another",
            )
    hook = Webhook(
        url=check_url(url, allow_private=allow_private, resolve=resolve),
        secret=secret or secrets.token_hex(32),
        events=check_events(events if events is not None else DEFAULT_WEBHOOK_EVENTS),
        enabled=enabled,
        created_at=now or utcnow(),
        token_id=token_id,
    )
    session.add(hook)
    session.flush()
    return hook


def _lock_token(session: Session, token_id: int) -> None:
    """Hold the token's row until the caller commits (SQLite: a write takes the database's write lock)."""
    if session.get_bind().dialect.name == "sqlite":
        stmt = sa.update(ApiToken).where(ApiToken.id == token_id).values(id=ApiToken.id)
        session.execute(stmt.execution_options(synchronize_session=False))
    else:
        session.execute(sa.select(ApiToken.id).where(ApiToken.id == token_id).with_for_update())


def list_webhooks(session: Session) -> list[Webhook]:
    return list(session.scalars(sa.select(Webhook).order_by(Webhook.id)))


def get_webhook(session: Session, webhook_id: int) -> Webhook | None:
    return session.get(Webhook, webhook_id)


def update_webhook(
    session: Session,
    hook: Webhook,
    *,
    enabled: bool | None = None,
    events: Sequence[str] | None = None,
    now: datetime | None = None,
) -> Webhook:
    """Enable or disable, change the events. Disabling ends the webhook's pending deliveries (failed, with
    that reason): a webhook turned off sends nothing more, and turning it on again sends no backlog."""
    if events is not None:
        hook.events = check_events(events)
    if enabled is not None:
        hook.enabled = enabled
        if not enabled:
            session.execute(
                sa.update(WebhookDelivery)
                .where(WebhookDelivery.webhook_id == hook.id, WebhookDelivery.status == "pending")
                .values(status="failed", error="webhook disabled", next_attempt_at=None)
                .execution_options(synchronize_session=False)
            )
    session.flush()
    return hook


def delete_webhook(session: Session, hook: Webhook) -> None:
    """The webhook and its delivery log."""
    session.execute(
        sa.delete(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == hook.id)
        .execution_options(synchronize_session=False)
    )
    session.delete(hook)
    session.flush()


def list_deliveries(session: Session, webhook_id: int, limit: int = 100) -> list[WebhookDelivery]:
    stmt = (
        sa.select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
    )
    return list(session.scalars(stmt))


def enqueue_event(
    session: Session, event: str, payload: dict[str, Any], regression_id: int | None = None, now: datetime | None = None
) -> list[int]:
    """One pending delivery per enabled webhook subscribed to `event`; returns their ids."""
    assert event in WEBHOOK_EVENTS, event
    now = now or utcnow()
    hooks = [h for h in session.scalars(sa.select(Webhook).where(Webhook.enabled.is_(True))) if event in h.events]
    rows = [
        WebhookDelivery(
            webhook_id=h.id,
            regression_id=regression_id,
            event=event,
            payload=payload,
            status="pending",
            attempt=0,
            attempts_log=[],
            next_attempt_at=now,
            created_at=now,
        )
        for h in hooks
    ]
    session.add_all(rows)
    session.flush()
    return [r.id for r in rows]


def due_deliveries(session: Session, now: datetime, limit: int = 50) -> list[tuple[int, datetime]]:
    stmt = (
        sa.select(WebhookDelivery.id, WebhookDelivery.next_attempt_at)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
    )
    return [(r.id, r.next_attempt_at) for r in session.execute(stmt)]


def delivery_hosts(session: Session, delivery_ids: list[int]) -> dict[int, str]:
    """The receiver (the URL's host, lower case, and port) of each delivery: the unit of the sender's back-off, so a
    dead port does not hold back another receiver on the same host."""
    if not delivery_ids:
        return {}
    stmt = (
        sa.select(WebhookDelivery.id, Webhook.url)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(WebhookDelivery.id.in_(delivery_ids))
    )
    return {row.id: _receiver(row.url) for row in session.execute(stmt)}


def _receiver(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a port: the attempt will fail on its own; one receiver for the host
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return f"{(parts.hostname or '').lower()}:{port or default}"


def claim_delivery(
    session: Session, delivery_id: int, seen_next_attempt_at: datetime, now: datetime, lease_s: float
) -> bool:
    """Compare-and-set: this sender owns the attempt; another sender sees next_attempt_at in the future."""
    stmt = (
        sa.update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery_id,
            WebhookDelivery.status == "pending",
            WebhookDelivery.next_attempt_at == seen_next_attempt_at,
        )
        .values(next_attempt_at=now + timedelta(seconds=lease_s), attempt=WebhookDelivery.attempt + 1)
        .execution_options(synchronize_session=False)
    )
    return rowcount(session.execute(stmt)) == 1


def record_attempt(
    session: Session,
    delivery_id: int,
    *,
    now: datetime,
    status_code: int | None,
    error: str | None,
    duration_ms: float,
    delivered: bool,
    retry_at: datetime | None,
) -> None:
    """The outcome of one attempt: delivered, retry at `retry_at`, or failed for good (retry_at None). Nothing
    when the delivery is gone (its webhook was deleted during the attempt)."""
    d = session.get(WebhookDelivery, delivery_id)
    if d is None:
        return
    d.status_code, d.error = status_code, error
    d.attempts_log = [
        *d.attempts_log,
        {
            "attempt": d.attempt,
            "at": now.isoformat(),
            "status_code": status_code,
            "error": error,
            "duration_ms": round(duration_ms, 1),
        },
    ]
    if delivered:
        d.status, d.delivered_at, d.next_attempt_at = "delivered", now, None
    elif retry_at is None:
        d.status, d.next_attempt_at = "failed", None
    else:
        d.next_attempt_at = retry_at
    session.flush()
