"""Webhooks and their delivery outbox."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, enum_check, utcnow

DELIVERY_STATUSES = ("pending", "delivered", "failed")
WEBHOOK_EVENTS = (
    "regression.suspected",
    "regression.confirmed",
    "regression.failed",
    "regression.recovered",
    "regression.improved",
)
DEFAULT_WEBHOOK_EVENTS: Final = ("regression.confirmed",)


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(sa.String(2000))
    secret: Mapped[str] = mapped_column(sa.String(200))  # HMAC-SHA256 key (kept: the sender needs it)
    events: Mapped[list[Any]] = mapped_column(default=list)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # the token that created it (its webhooks are capped); no foreign key: a revoked token's webhooks stay
    token_id: Mapped[int | None] = mapped_column(index=True)


class WebhookDelivery(Base):
    """An outbox row per (webhook, event): attempted until delivered (2xx) or out of attempts."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        enum_check("status", DELIVERY_STATUSES),
        sa.Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    webhook_id: Mapped[int] = mapped_column(sa.ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    regression_id: Mapped[int | None] = mapped_column(sa.ForeignKey("regressions.id", ondelete="SET NULL"))
    event: Mapped[str] = mapped_column(sa.String(64))
    payload: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(sa.String(16), default="pending")
    attempt: Mapped[int] = mapped_column(default=0)  # attempts made so far
    status_code: Mapped[int | None]  # of the last attempt
    error: Mapped[str | None] = mapped_column(sa.Text)  # of the last attempt
    attempts_log: Mapped[list[Any]] = mapped_column(default=list)  # [{attempt, at, status_code, error, duration_ms}]
    next_attempt_at: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
