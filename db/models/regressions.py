"""Regressions: a series point's metric that moved beyond its baseline band, and its lifecycle."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, enum_check, utcnow

REGRESSION_STATUSES = ("suspected", "confirmed", "recovered", "improved", "failed")


class Regression(Base):
    """One episode of one series point (run key + cluster) and metric: opened `suspected` (or `failed`),
    `confirmed` the next bad night, closed `recovered` (or resolved by hand); `improved` rows are records."""

    __tablename__ = "regressions"
    __table_args__ = (
        enum_check("status", REGRESSION_STATUSES),
        sa.Index("ix_regressions_point", "suite_id", "run_key", "cluster", "metric"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    suite_id: Mapped[int] = mapped_column(sa.ForeignKey("suites.id", ondelete="CASCADE"))
    run_key: Mapped[str] = mapped_column(sa.String(64))
    cluster: Mapped[str] = mapped_column(sa.String(100))
    metric: Mapped[str] = mapped_column(sa.String(64), index=True)
    point: Mapped[dict[str, Any]] = mapped_column(default=dict)  # model, precision, layout, num_devices (labels)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    baseline: Mapped[float | None]
    band_low: Mapped[float | None]
    band_high: Mapped[float | None]
    value: Mapped[float | None]  # the latest night's value
    delta_pct: Mapped[float | None]  # (value / baseline - 1) * 100
    message: Mapped[str] = mapped_column(sa.Text, default="")
    first_bad_experiment_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experiments.id", ondelete="SET NULL"))
    first_bad_run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="SET NULL"))
    last_good_run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="SET NULL"))
    latest_experiment_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experiments.id", ondelete="SET NULL"))
    env_diff: Mapped[dict[str, Any] | None]  # core.analysis.regression.EnvDiff: changed keys first (the likely cause)
    events: Mapped[list[Any]] = mapped_column(default=list)  # [{at, state, experiment_id, run_id, value}]
    num_bad_nights: Mapped[int] = mapped_column(default=0)
    resolution: Mapped[str | None] = mapped_column(sa.String(16))  # recovered | manual, once closed
    acknowledged_at: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
