"""Suites (saved experiment templates on a cron schedule), their firings and evaluations.

`experiments.suite_id` (an indexed int, no FK: adding one would rebuild the experiments table on SQLite)
names the suite that fired it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, enum_check, utcnow

DEFAULT_SCHEDULE = "0 2 * * *"  # 02:00 UTC every night
# What a scheduled firing does while an earlier firing of its suite has unfinished runs (Kubernetes CronJob's
# concurrencyPolicy): skip it (the default), queue it behind them, or replace them (cancel, then fire).
CONCURRENCY_POLICIES = ("skip", "queue", "replace")
DEFAULT_CONCURRENCY_POLICY: Final = "skip"
DEFAULT_MAX_QUEUED_RUNS = 200  # a firing is skipped while this many of the suite's runs are still queued
FIRING_OUTCOMES = ("fired", "skipped", "failed")
FIRING_TRIGGERS = ("schedule", "manual")
MAX_FIRINGS_KEPT = 1000  # per suite: older firing records are deleted as new ones come


class Suite(Base):
    """A saved experiment template fired on a cron schedule; its experiments carry suite_id."""

    __tablename__ = "suites"
    __table_args__ = (enum_check("concurrency_policy", CONCURRENCY_POLICIES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    spec: Mapped[dict[str, Any]]  # ExperimentSpec JSON (the template; cluster overridden by `cluster`)
    cluster: Mapped[str] = mapped_column(sa.String(100))
    schedule: Mapped[str] = mapped_column(sa.String(100), default=DEFAULT_SCHEDULE)  # 5-field cron, UTC
    enabled: Mapped[bool] = mapped_column(default=True)
    thresholds: Mapped[dict[str, Any]] = mapped_column(default=dict)  # metric -> fraction (limit for fp8_loss_gap)
    baseline_nights: Mapped[int] = mapped_column(default=7)  # K: baseline = median of the last K good nights
    last_fired_at: Mapped[datetime | None]
    next_fire_at: Mapped[datetime | None] = mapped_column(index=True)  # claimed by compare-and-set
    last_error: Mapped[str | None] = mapped_column(sa.Text)  # why the last firing created no experiment
    concurrency_policy: Mapped[str] = mapped_column(
        sa.String(16), default=DEFAULT_CONCURRENCY_POLICY, server_default=DEFAULT_CONCURRENCY_POLICY
    )
    max_queued_runs: Mapped[int] = mapped_column(
        default=DEFAULT_MAX_QUEUED_RUNS, server_default=str(DEFAULT_MAX_QUEUED_RUNS)
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class SuiteFiring(Base):
    """One firing of a suite, scheduled or manual: the experiment it created, or why it created none (skipped by
    the concurrency policy or the queued-run cap, failed to expand), and what it replaced."""

    __tablename__ = "suite_firings"
    __table_args__ = (
        enum_check("outcome", FIRING_OUTCOMES),
        enum_check("trigger", FIRING_TRIGGERS),
        sa.Index("ix_suite_firings_suite_id_id", "suite_id", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    suite_id: Mapped[int] = mapped_column(sa.ForeignKey("suites.id", ondelete="CASCADE"))
    fired_at: Mapped[datetime]
    trigger: Mapped[str] = mapped_column(sa.String(16))
    outcome: Mapped[str] = mapped_column(sa.String(16))
    experiment_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experiments.id", ondelete="SET NULL"))
    num_runs: Mapped[int] = mapped_column(default=0)  # runs the firing created
    num_cancelled: Mapped[int] = mapped_column(default=0)  # runs of earlier firings it cancelled (replace)
    reason: Mapped[str | None] = mapped_column(sa.Text)  # why skipped or failed; what was replaced


class SuiteEvaluation(Base):
    """One row per suite experiment whose results were checked for regressions (inserted with the findings,
    so a second beat process checking the same experiment fails on the primary key and rolls back)."""

    __tablename__ = "suite_evaluations"

    experiment_id: Mapped[int] = mapped_column(sa.ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    suite_id: Mapped[int] = mapped_column(sa.ForeignKey("suites.id", ondelete="CASCADE"), index=True)
    evaluated_at: Mapped[datetime] = mapped_column(default=utcnow)
    num_points: Mapped[int] = mapped_column(default=0)
    num_findings: Mapped[int] = mapped_column(default=0)
