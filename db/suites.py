"""Suites: saved experiment templates on a cron schedule. Create, read, update, claim a due firing, and
create the suite's experiment through the normal path (expand -> experiment + runs; the caller commits,
then dispatches). Functions never commit.

Claiming a firing is one compare-and-set UPDATE (`WHERE id = ? AND next_fire_at = <the value read>`): two
beat processes that read the same due suite both try it, exactly one changes a row. On PostgreSQL the
second UPDATE waits for the first transaction and then re-checks its WHERE against the committed row;
SQLite serializes writers. The claim and the experiment are committed together, so a crash between them
leaves neither.

Concurrency (what a scheduled firing does while an earlier firing of the suite has unfinished runs, as in a
Kubernetes CronJob): `skip` (the default) records the firing as skipped with its reason; `queue` fires anyway;
`replace` cancels the earlier firings' unfinished runs (queued ones now, running ones through their worker)
and fires. Whatever the policy, a firing is skipped while the suite has max_queued_runs runs still queued, so
a schedule faster than its runs cannot pile up work without bound. A manual trigger ignores the policy but not
the cap. Every firing is recorded (suite_firings: fired, skipped or failed, with the reason).

The cap holds under concurrent firings (ten simultaneous `POST /suites/{id}/trigger`, a trigger racing the
beat): fire_suite first locks the suite's row (lock_suite: SELECT ... FOR UPDATE on PostgreSQL; on SQLite a
write to the row, which takes the database's write lock as BEGIN IMMEDIATE would), then counts the queued
runs and creates the experiment in that one transaction; a second firing waits for the first to commit and
counts its runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.analysis.regression import DEFAULT_METRICS
from core.contracts.clusters import Cluster
from core.contracts.cron import ALIASES, CronError
from core.contracts.cron import parse as parse_cron
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec
from db.base import utcnow
from db.experiments import create_experiment
from db.models import (
    CONCURRENCY_POLICIES,
    DEFAULT_CONCURRENCY_POLICY,
    DEFAULT_MAX_QUEUED_RUNS,
    DEFAULT_SCHEDULE,
    MAX_FIRINGS_KEPT,
    Experiment,
    Run,
    Suite,
    SuiteFiring,
)
from db.session import rowcount

NIGHTLY_METRICS = (
    "tokens_per_sec",
    "efficiency",
    "fp8_speedup",
    "effective_speedup",
    "peak_memory_allocated_gib",
    "fp8_loss_gap",
    "numerics",
)
# Ratios of two throughputs carry the noise of both: with +-3% on each, E(N) and S(N) move +-6%. effective_speedup
# is S(N) / steps_ratio, whose night-to-night noise under one seed is not measured; bench/nightly_thresholds.py
# replays 500 simulated 30-night series per row (bench/results/2026-12-07-nightly-thresholds.md): E(N), S(N) at
# 8%: 0.2-0.4% of series with a false alarm, a 12% drop caught in 79-80%; effective_speedup at 12%: no false
# alarm up to 2% steps_ratio noise (8% would give 7.4% at 2%, 17% at 3%), a 20% drop caught in 93-100%.
DERIVED_THRESHOLDS = {"efficiency": 0.08, "fp8_speedup": 0.08, "effective_speedup": 0.12}
MAX_SUITE_TAGS = 32


class SuiteError(ValueError):
    """Bad suite input; `field` names it and `allowed` lists the allowed values when finite."""

    def __init__(self, field: str, message: str, allowed: list[Any] | None = None):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.allowed = field, message, allowed


SCHEDULE_FORMS = ["5-field cron 'minute hour day-of-month month day-of-week', e.g. '0 2 * * *'", *ALIASES]


def check_schedule(schedule: str) -> str:
    try:
        return parse_cron(schedule).expression
    except ValueError as exc:
        message = str(exc)
        if isinstance(exc, CronError) and exc.field == "schedule":
            message = message.removeprefix("schedule: ")  # the field is named once, by SuiteError
        raise SuiteError("schedule", message, SCHEDULE_FORMS) from exc


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


MAX_QUEUED_RUNS_LIMIT = 100_000


def check_concurrency(policy: str | None, max_queued_runs: int | None) -> None:
    if policy is not None and policy not in CONCURRENCY_POLICIES:
        raise SuiteError("concurrency_policy", f"unknown policy {policy!r}", list(CONCURRENCY_POLICIES))
    if max_queued_runs is not None and not 1 <= max_queued_runs <= MAX_QUEUED_RUNS_LIMIT:
        raise SuiteError("max_queued_runs", f"{max_queued_runs} runs: must be 1..{MAX_QUEUED_RUNS_LIMIT}")


def suite_spec(suite: Suite, fired_at: datetime | None = None) -> ExperimentSpec:
    """The suite's template on the suite's cluster, named after the suite and the firing."""
    spec = ExperimentSpec.model_validate(suite.spec)
    tag = f"suite:{suite.name}"[:64]
    tags = list(spec.tags) + ([tag] if tag not in spec.tags and len(spec.tags) < MAX_SUITE_TAGS else [])
    name = f"{suite.name} {fired_at:%Y-%m-%d %H:%M}" if fired_at else suite.name
    return spec.model_copy(update={"cluster": suite.cluster, "tags": tags, "name": name[:200]})


def check_expands(spec: ExperimentSpec, cluster: Cluster) -> None:
    """The template must give runs on its cluster (raises core.contracts.matrix.MatrixError otherwise)."""
    expand(spec.model_copy(update={"cluster": cluster.name}), cluster)


def create_suite(
    session: Session,
    *,
    name: str,
    spec: ExperimentSpec,
    cluster: str,
    schedule: str = DEFAULT_SCHEDULE,
    enabled: bool = True,
    thresholds: Mapping[str, float] | None = None,
    baseline_nights: int = 7,
    concurrency_policy: str = DEFAULT_CONCURRENCY_POLICY,
    max_queued_runs: int = DEFAULT_MAX_QUEUED_RUNS,
    now: datetime | None = None,
) -> Suite:
    now = now or utcnow()
    expression = check_schedule(schedule)
    check_concurrency(concurrency_policy, max_queued_runs)
    suite = Suite(
        name=name,
        spec=spec.model_copy(update={"cluster": cluster}).model_dump(mode="json"),
        cluster=cluster,
        schedule=expression,
        enabled=enabled,
        thresholds=check_thresholds(thresholds or {}),
        baseline_nights=baseline_nights,
        next_fire_at=parse_cron(expression).next_after(now) if enabled else None,
        concurrency_policy=concurrency_policy,
        max_queued_runs=max_queued_runs,
        created_at=now,
        updated_at=now,
    )
    session.add(suite)
    session.flush()
    return suite


def update_suite(
    session: Session,
    suite: Suite,
    *,
    enabled: bool | None = None,
    schedule: str | None = None,
    thresholds: Mapping[str, float] | None = None,
    baseline_nights: int | None = None,
    concurrency_policy: str | None = None,
    max_queued_runs: int | None = None,
    now: datetime | None = None,
) -> Suite:
    """Enable/disable, reschedule, change thresholds or the concurrency policy and cap; the next firing is
    recomputed from `now`."""
    now = now or utcnow()
    check_concurrency(concurrency_policy, max_queued_runs)
    if concurrency_policy is not None:
        suite.concurrency_policy = concurrency_policy
    if max_queued_runs is not None:
        suite.max_queued_runs = max_queued_runs
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
    stmt = (
        sa.select(Suite.id, Suite.next_fire_at)
        .where(Suite.enabled.is_(True), Suite.next_fire_at.is_not(None), Suite.next_fire_at <= now)
        .order_by(Suite.next_fire_at, Suite.id)
    )
    return [(row.id, row.next_fire_at) for row in session.execute(stmt)]


def claim_firing(session: Session, suite_id: int, seen_next_fire_at: datetime, now: datetime) -> bool:
    """Compare-and-set: move next_fire_at past `now` only if it still holds the value we saw. True: ours."""
    schedule = session.scalar(sa.select(Suite.schedule).where(Suite.id == suite_id))
    if schedule is None:
        return False
    stmt = (
        sa.update(Suite)
        .where(Suite.id == suite_id, Suite.enabled.is_(True), Suite.next_fire_at == seen_next_fire_at)
        .values(next_fire_at=parse_cron(schedule).next_after(now), last_fired_at=now)
        .execution_options(synchronize_session=False)
    )
    return rowcount(session.execute(stmt)) == 1


def record_fire_error(session: Session, suite_id: int, error: str | None) -> None:
    session.execute(
        sa.update(Suite)
        .where(Suite.id == suite_id)
        .values(last_error=error)
        .execution_options(synchronize_session=False)
    )


def create_suite_experiment(
    session: Session, suite: Suite, cluster: Cluster, now: datetime | None = None
) -> tuple[Experiment, list[int]]:
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
    """What firing a suite stored: its experiment and runs, or why it could not (recorded on the suite), or why
    it was skipped (the concurrency policy or the queued-run cap; recorded as a skipped firing)."""

    suite_id: int
    experiment_id: int | None
    run_ids: list[int] = field(default_factory=list)
    error: str | None = None
    dispatched: bool = False
    skipped: str | None = None  # the reason a firing created nothing on purpose
    num_cancelled: int = 0  # runs of earlier firings cancelled (replace)


@dataclass(frozen=True)
class Unfinished:
    """The suite's runs that have not ended, over all its experiments."""

    num_queued: int
    num_active: int  # pending or running
    experiment_ids: list[int]

    @property
    def total(self) -> int:
        return self.num_queued + self.num_active


def unfinished_runs(session: Session, suite_id: int) -> Unfinished:
    stmt = (
        sa.select(Run.experiment_id, Run.status, sa.func.count())
        .join(Experiment, Experiment.id == Run.experiment_id)
        .where(Experiment.suite_id == suite_id, Run.status.in_(("queued", "pending", "running")))
        .group_by(Run.experiment_id, Run.status)
    )
    rows = session.execute(stmt).all()
    return Unfinished(
        num_queued=sum(n for _, status, n in rows if status == "queued"),
        num_active=sum(n for _, status, n in rows if status != "queued"),
        experiment_ids=sorted({e for e, _, _ in rows}),
    )


def _runs(n: int) -> str:
    return f"{n} run of earlier firings is" if n == 1 else f"{n} runs of earlier firings are"


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def cancel_unfinished(session: Session, suite: Suite, now: datetime) -> int:
    """`replace`: the suite's queued runs -> cancelled now; its pending and running runs get cancel_requested
    (their worker stops them within seconds). Returns how many runs were cancelled or asked to stop."""
    of_suite = Run.experiment_id.in_(sa.select(Experiment.id).where(Experiment.suite_id == suite.id))
    message = f"cancelled: replaced by a newer firing of suite {suite.name!r}"[:2000]
    cancelled = rowcount(
        session.execute(
            sa.update(Run)
            .where(of_suite, Run.status == "queued")
            .values(status="cancelled", error_kind="cancelled", error_message=message, finished_at=now)
            .execution_options(synchronize_session=False)
        )
    )
    marked = rowcount(
        session.execute(
            sa.update(Run)
            .where(of_suite, Run.status.in_(("pending", "running")), Run.cancel_requested.is_(False))
            .values(cancel_requested=True)
            .execution_options(synchronize_session=False)
        )
    )
    return cancelled + marked


def firing_skip_reason(suite: Suite, unfinished: Unfinished, trigger: str) -> str | None:
    """Why this firing must not create an experiment, or None (replace cancels before it asks)."""
    if trigger == "schedule" and suite.concurrency_policy == "skip" and unfinished.total:
        return (
            f"concurrency_policy skip: earlier firings have {unfinished.total} unfinished runs "
            f"({unfinished.num_queued} queued, {unfinished.num_active} running) in experiments "
            f"{_ids(unfinished.experiment_ids)}"
        )
    if unfinished.num_queued >= suite.max_queued_runs:
        return (
            f"max_queued_runs: {_runs(unfinished.num_queued)} still queued "
            f"(the cap is {suite.max_queued_runs}) in experiments {_ids(unfinished.experiment_ids)}"
        )
    return None


def record_firing(session: Session, suite_id: int, now: datetime, trigger: str, fired: Fired) -> SuiteFiring:
    """One row per firing; only the newest MAX_FIRINGS_KEPT of a suite are kept."""
    outcome = "fired" if fired.experiment_id is not None else "skipped" if fired.skipped else "failed"
    replaced = (
        f"replaced earlier firings: {fired.num_cancelled} runs cancelled or asked to stop"
        if fired.num_cancelled
        else None
    )
    reason = "; ".join(r for r in (replaced, fired.skipped or fired.error) if r) or None
    row = SuiteFiring(
        suite_id=suite_id,
        fired_at=now,
        trigger=trigger,
        outcome=outcome,
        experiment_id=fired.experiment_id,
        num_runs=len(fired.run_ids),
        num_cancelled=fired.num_cancelled,
        reason=reason[:2000] if reason else None,
    )
    session.add(row)
    session.flush()
    oldest_kept = (
        sa.select(SuiteFiring.id)
        .where(SuiteFiring.suite_id == suite_id)
        .order_by(SuiteFiring.id.desc())
        .offset(MAX_FIRINGS_KEPT - 1)
        .limit(1)
        .scalar_subquery()
    )
    session.execute(
        sa.delete(SuiteFiring)
        .where(SuiteFiring.suite_id == suite_id, SuiteFiring.id < oldest_kept)
        .execution_options(synchronize_session=False)
    )
    return row


def list_firings(session: Session, suite_id: int, limit: int = 50) -> list[SuiteFiring]:
    stmt = sa.select(SuiteFiring).where(SuiteFiring.suite_id == suite_id).order_by(SuiteFiring.id.desc()).limit(limit)
    return list(session.scalars(stmt))


def lock_suite(session: Session, suite_id: int) -> Suite | None:
    """Lock the suite's row until the caller commits and return it read fresh (None: it is gone). Another
    firing of the suite waits here, then sees this one's runs (each statement reads what was committed)."""
    if session.get_bind().dialect.name == "sqlite":
        # SQLite has no row locks: a write takes the database's write lock now (the equivalent of BEGIN
        # IMMEDIATE), so that no other writer commits between the count below and this firing's commit.
        session.execute(
            sa.update(Suite)
            .where(Suite.id == suite_id)
            .values(id=Suite.id)
            .execution_options(synchronize_session=False)
        )
    stmt = sa.select(Suite).where(Suite.id == suite_id).with_for_update()
    return session.scalars(stmt.execution_options(populate_existing=True)).first()


def fire_suite(
    session: Session, suite: Suite, clusters: Mapping[str, Cluster], now: datetime, trigger: str = "schedule"
) -> Fired:
    """Create the suite's experiment (the caller already holds the claim, or this is a manual trigger) unless
    the concurrency policy or the queued-run cap skips it; or record on the suite why it cannot expand. Every
    outcome is recorded as a firing. The cap check and the firing are one transaction under the suite's row
    lock (lock_suite). The caller commits, then publishes the run ids."""
    locked = lock_suite(session, suite.id)
    if locked is None:
        return Fired(suite.id, None, error=f"suite {suite.id} was deleted")
    suite = locked
    unfinished = unfinished_runs(session, suite.id)
    num_cancelled = 0
    if trigger == "schedule" and suite.concurrency_policy == "replace" and unfinished.total:
        num_cancelled = cancel_unfinished(session, suite, now)
        unfinished = Unfinished(0, 0, [])
    skip = firing_skip_reason(suite, unfinished, trigger)
    if skip is not None:
        fired = Fired(suite.id, None, skipped=skip)
        record_firing(session, suite.id, now, trigger, fired)
        return fired
    try:
        if suite.cluster not in clusters:
            raise ValueError(f"cluster: {suite.cluster!r} is not configured; allowed: {', '.join(sorted(clusters))}")
        with session.begin_nested():
            exp, run_ids = create_suite_experiment(session, suite, clusters[suite.cluster], now)
        record_fire_error(session, suite.id, None)
    except ValueError as exc:  # unknown cluster, a matrix with no valid point, an outdated template
        record_fire_error(session, suite.id, str(exc)[:2000])
        fired = Fired(suite.id, None, error=str(exc), num_cancelled=num_cancelled)
        record_firing(session, suite.id, now, trigger, fired)
        return fired
    fired = Fired(suite.id, exp.id, run_ids, num_cancelled=num_cancelled)
    record_firing(session, suite.id, now, trigger, fired)
    return fired


def metric_configs(suite: Suite) -> dict[str, Any]:
    """core.analysis.regression MetricConfigs of the nightly metrics: defaults, DERIVED_THRESHOLDS, then the suite's
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
