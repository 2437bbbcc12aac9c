"""Regression reads and the two hand actions: list (filters), one row, acknowledge, resolve, and the
history of a regression's series point and metric with the baseline band of every night."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.analysis.regression import baseline_band
from db.base import utcnow
from db.detection import RUN_STATUS, RUN_STATUS_CONFIG, history_for, previous_experiments
from db.models import Regression, Suite
from db.nightly_points import load_nights
from db.suites import metric_configs


def list_regressions(
    session: Session,
    *,
    suite_id: int | None = None,
    status: str | None = None,
    metric: str | None = None,
    since: datetime | None = None,
    open_only: bool = False,
    limit: int = 100,
    before_id: int | None = None,
) -> list[Regression]:
    """Newest first (keyset on id; limit + 1 rows so the caller knows whether there is another page)."""
    stmt = sa.select(Regression).order_by(Regression.id.desc()).limit(limit + 1)
    if suite_id is not None:
        stmt = stmt.where(Regression.suite_id == suite_id)
    if status is not None:
        stmt = stmt.where(Regression.status == status)
    if metric is not None:
        stmt = stmt.where(Regression.metric == metric)
    if since is not None:
        stmt = stmt.where(Regression.updated_at >= since)
    if open_only:
        stmt = stmt.where(Regression.resolved_at.is_(None), Regression.status.in_(("suspected", "confirmed", "failed")))
    if before_id is not None:
        stmt = stmt.where(Regression.id < before_id)
    return list(session.scalars(stmt))


def get_regression(session: Session, regression_id: int) -> Regression | None:
    return session.get(Regression, regression_id)


def acknowledge(session: Session, row: Regression, now: datetime | None = None) -> Regression:
    """Someone is on it: detection continues, the row stays open. Idempotent (keeps the first time)."""
    if row.acknowledged_at is None:
        row.acknowledged_at = row.updated_at = now or utcnow()
    session.flush()
    return row


def resolve(session: Session, row: Regression, now: datetime | None = None) -> Regression:
    """Close by hand ("accept"): the point's baseline re-forms from the nights after now. Idempotent."""
    if row.resolved_at is None:
        now = now or utcnow()
        row.resolved_at = row.updated_at = now
        row.resolution = "manual"
        row.acknowledged_at = row.acknowledged_at or now
    session.flush()
    return row


def series_history(session: Session, row: Regression, limit: int = 60) -> list[dict[str, Any]]:
    """The last `limit` nights of the row's point and metric, each with the band it was judged against."""
    suite = session.get(Suite, row.suite_id)
    assert suite is not None
    config = RUN_STATUS_CONFIG if row.metric == RUN_STATUS else metric_configs(suite).get(row.metric)
    ids = previous_experiments(session, suite.id, utcnow(), limit + (config.noise_nights if config else 0))
    nights = load_nights(session, ids)
    rows = list(
        session.scalars(
            sa.select(Regression)
            .where(
                Regression.suite_id == row.suite_id,
                Regression.run_key == row.run_key,
                Regression.cluster == row.cluster,
                Regression.metric == row.metric,
            )
            .order_by(Regression.id)
        )
    )
    values = history_for(nights, ids, (row.run_key, row.cluster), row.metric, rows, after_manual_resolve=False)
    out = []
    for i, v in enumerate(values):
        band = baseline_band(values[:i], config) if config and config.limit is None else None
        out.append(
            {
                "timestamp": v.timestamp,
                "run_id": v.run_id,
                "status": v.status,
                "value": v.value,
                "flagged": v.flagged,
                "baseline": band.baseline if band else None,
                "band_low": band.low if band else None,
                "band_high": band.high if band else None,
                "limit": config.limit if config else None,
            }
        )
    return out[-limit:]
