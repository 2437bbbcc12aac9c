"""Suites: saved experiment templates on a cron schedule. Create, read, update, claim a due firing, and
create the suite's experiment through the normal path (expand -> experiment + runs; the caller commits,
then dispatches). Functions never commit.

Claiming a firing is one compare-and-set UPDATE (`WHERE id = ? AND next_fire_at = <the value read>`): two
beat processes that read the same due suite both try it, exactly one changes a row. On PostgreSQL the
second UPDATE waits for the first transaction and then re-checks its WHERE against the committed row;
SQLite serializes writers. The claim and the experiment are committed together, so a crash between them
leaves neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.clusters import Cluster
from core.cron import parse as parse_cron
from core.matrix import expand
from core.regression import DEFAULT_METRICS
from core.specs import ExperimentSpec
from db.experiments import create_experiment
from db.models import Experiment, utcnow
from db.models_nightly import DEFAULT_SCHEDULE, Suite

NIGHTLY_METRICS = ("tokens_per_sec", "efficiency", "fp8_speedup", "peak_memory_allocated_gib", "fp8_loss_gap",
                   "numerics")
# Ratios of two throughputs carry the noise of both: with +-3% on each, E(N) and S(N) move +-6%. Simulated
# over 300 seeded 30-night series (uniform +-3% per run): threshold 5% gave 15% of series a false alarm,
# 8% gave none, and still caught a 12% drop on the first two nights in 82% of series.
DERIVED_THRESHOLDS = {"efficiency": 0.08, "fp8_speedup": 0.08}
MAX_SUITE_TAGS = 32


class SuiteError(ValueError):
    """Bad suite input; `field` names it and `allowed` lists the allowed values when finite."""

    def __init__(self, field: str, message: str, allowed: list[Any] | None = None):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.allowed = field, message, allowed


def check_schedule(schedule: str) -> str:
    try:
        return parse_cron(schedule).expression
    except ValueError as exc:
        raise SuiteError("schedule", str(exc), ["5-field cron 'minute hour day-of-month month day-of-week', "
                                                "e.g. '0 2 * * *'", "@daily", "@hourly", "@weekly"]) from exc


def check_thresholds(thresholds: Mapping[str, float]) -> dict[str, float]:
    """metric -> fraction in (0, 1]: relative threshold, or the absolute limit for fp8_loss_gap."""
    out = {}
    for metric, value in thresholds.items():
        if metric not in NIGHTLY_METRICS:
            raise SuiteError(f"thresholds.{metric}", f"unknown metric {metric!r}", list(NIGHTLY_METRICS))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise SuiteError(f"thresholds.{metric}", f"{value!r} must be a fraction in (0, 1], e.g. 0.05")
        out[metric] = float(value)
    return out


def suite_spec(suite: Suite, fired_at: datetime | None = None) -> ExperimentSpec:
    """The suite's template on the suite's cluster, named after the suite and the firing."""
    spec = ExperimentSpec.model_validate(suite.spec)
    tag = f"suite:{suite.name}"[:64]
    tags = list(spec.tags) + ([tag] if tag not in spec.tags and len(spec.tags) < MAX_SUITE_TAGS else [])
    name = f"{suite.name} {fired_at:%Y-%m-%d %H:%M}" if fired_at else suite.name
    return spec.model_copy(update={"cluster": suite.cluster, "tags": tags, "name": name[:200]})


def check_expands(spec: ExperimentSpec, cluster: Cluster) -> None:
    """The template must give runs on its cluster (raises core.matrix.MatrixError otherwise)."""
    expand(spec.model_copy(update={"cluster": cluster.name}), cluster)


def create_suite(session: Session, *, name: str, spec: ExperimentSpec, cluster: str, schedule: str = DEFAULT_SCHEDULE,
                 enabled: bool = True, thresholds: Mapping[str, float] | None = None, baseline_nights: int = 7,
                 now: datetime | None = None) -> Suite:
    now = now or utcnow()
    expression = check_schedule(schedule)
    suite = Suite(name=name, spec=spec.model_copy(update={"cluster": cluster}).model_dump(mode="json"),
                  cluster=cluster, schedule=expression, enabled=enabled,
                  thresholds=check_thresholds(thresholds or {}), baseline_nights=baseline_nights,
                  next_fire_at=parse_cron(expression).next_after(now) if enabled else None,
                  created_at=now, updated_at=now)
    session.add(suite)
    session.flush()
    return suite


def update_suite(session: Session, suite: Suite, *, enabled: bool | None = None, schedule: str | None = None,
                 thresholds: Mapping[str, float] | None = None, baseline_nights: int | None = None,
                 now: datetime | None = None) -> Suite:
    """Enable/disable, reschedule, change thresholds; the next firing is recomputed from `now`."""
    now = now or utcnow()
    if schedule is not None:
        suite.schedule = check_schedule(schedule)
    if thresholds is not None:
        suite.thresholds = check_thresholds(thresholds)
    if baseline_nights is not None:
        suite.baseline_nights = baseline_nights
    if enabled is not None:
        suite.enabled = enabled
    if enabled is not None or schedule is not None:
        suite.next_fire_at = parse_cron(suite.schedule).next_after(now) if suite.enabled else None
    suite.updated_at = now
    session.flush()
    return suite


def get_suite(session: Session, suite_id: int) -> Suite | None:
    return session.get(Suite, suite_id)


def get_suite_by_name(session: Session, name: str) -> Suite | None:
    return session.scalars(sa.select(Suite).where(Suite.name == name)).first()


def list_suites(session: Session, *, enabled: bool | None = None) -> list[Suite]:
    stmt = sa.select(Suite).order_by(Suite.id)
    if enabled is not None:
        stmt = stmt.where(Suite.enabled.is_(enabled))
    return list(session.scalars(stmt))


def due_suites(session: Session, now: datetime) -> list[tuple[int, datetime]]:
    """(id, next_fire_at) of enabled suites due at `now`, read fresh from the database every time."""
    stmt = (sa.select(Suite.id, Suite.next_fire_at)
            .where(Suite.enabled.is_(True), Suite.next_fire_at.is_not(None), Suite.next_fire_at <= now)
            .order_by(Suite.next_fire_at, Suite.id))
    return [(row.id, row.next_fire_at) for row in session.execute(stmt)]


def claim_firing(session: Session, suite_id: int, seen_next_fire_at: datetime, now: datetime) -> bool:
    """Compare-and-set: move next_fire_at past `now` only if it still holds the value we saw. True: ours."""
    schedule = session.scalar(sa.select(Suite.schedule).where(Suite.id == suite_id))
    if schedule is None:
        return False
    stmt = (sa.update(Suite)
            .where(Suite.id == suite_id, Suite.enabled.is_(True), Suite.next_fire_at == seen_next_fire_at)
            .values(next_fire_at=parse_cron(schedule).next_after(now), last_fired_at=now)
            .execution_options(synchronize_session=False))
    return session.execute(stmt).rowcount == 1


def record_fire_error(session: Session, suite_id: int, error: str | None) -> None:
    session.execute(sa.update(Suite).where(Suite.id == suite_id).values(last_error=error)
                    .execution_options(synchronize_session=False))


def create_suite_experiment(session: Session, suite: Suite, cluster: Cluster,
                            now: datetime | None = None) -> tuple[Experiment, list[int]]:
    """The normal creation path for a suite firing: expand the template, store the experiment (source
    'suite', suite_id) and its queued runs. The caller commits, then dispatches the run ids."""
    now = now or utcnow()
    spec = suite_spec(suite, now)
    runs, _skipped = expand(spec, cluster)
    exp, run_ids = create_experiment(session, spec, runs, cluster.queue_name, source="suite", suite_id=suite.id)
    exp.created_at = now  # the night's timestamp: what history and baselines are ordered by
    session.flush()
    return exp, run_ids


@dataclass(frozen=True)
class Fired:
    """What firing a suite stored: its experiment and runs, or why it could not (recorded on the suite)."""

    suite_id: int
    experiment_id: int | None
    run_ids: list[int] = field(default_factory=list)
    error: str | None = None
    dispatched: bool = False


def fire_suite(session: Session, suite: Suite, clusters: Mapping[str, Cluster], now: datetime) -> Fired:
    """Create the suite's experiment (the caller already holds the claim, or this is a manual trigger), or
    record on the suite why it cannot expand. The caller commits, then publishes the run ids."""
    try:
        if suite.cluster not in clusters:
            raise ValueError(f"cluster: {suite.cluster!r} is not configured; allowed: {', '.join(sorted(clusters))}")
        with session.begin_nested():
            exp, run_ids = create_suite_experiment(session, suite, clusters[suite.cluster], now)
        record_fire_error(session, suite.id, None)
    except ValueError as exc:  # unknown cluster, a matrix with no valid point, an outdated template
        record_fire_error(session, suite.id, str(exc)[:2000])
        return Fired(suite.id, None, error=str(exc))
    return Fired(suite.id, exp.id, run_ids)


def metric_configs(suite: Suite) -> dict[str, Any]:
    """core.regression MetricConfigs of the nightly metrics: defaults, DERIVED_THRESHOLDS, then the suite's
    own thresholds and K."""
    out = {}
    for name in NIGHTLY_METRICS:
        base = DEFAULT_METRICS[name]
        override = suite.thresholds.get(name)
        changes: dict[str, Any] = {"baseline_nights": suite.baseline_nights}
        if name in DERIVED_THRESHOLDS:
            changes["threshold"] = DERIVED_THRESHOLDS[name]
        if override is not None:
            changes["limit" if base.limit is not None else "threshold"] = override
        out[name] = base.__class__(**(base.__dict__ | changes))
    return out
