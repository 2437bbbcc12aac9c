"""Experiment queries: create (with its runs, in bulk), read, list with cursor pagination, status, cancel.

An experiment's status is derived from its runs (never stored), in SQL so that list filters use it:
  queued    every run queued
  running   some run pending or running, or a mix of queued and ended runs
  succeeded every run ended and all succeeded
  failed    every run ended and at least one failed
  cancelled every run ended, none failed, at least one cancelled
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from core.contracts.specs import ExperimentSpec, RunSpec
from db.base import utcnow
from db.models import RUN_STATUSES, Experiment, Run, RunSummary
from db.session import rowcount

EXPERIMENT_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


@dataclass
class ExperimentStatus:
    status: str
    counts: dict[str, int] = field(default_factory=dict)  # per run status, all six present

    @property
    def num_runs(self) -> int:
        return sum(self.counts.values())

    @property
    def progress(self) -> float:
        """Fraction of runs that ended (succeeded, failed or cancelled), 0..1."""
        done = self.counts["succeeded"] + self.counts["failed"] + self.counts["cancelled"]
        return done / self.num_runs if self.num_runs else 0.0


def derive_status(counts: dict[str, int]) -> str:
    """The experiment status from per-run-status counts (same rules as `_status_expr`)."""
    c = {s: counts.get(s, 0) for s in RUN_STATUSES}
    total = sum(c.values())
    ended = c["succeeded"] + c["failed"] + c["cancelled"]
    if total == 0 or c["queued"] == total:
        return "queued"
    if ended < total:
        return "running"
    if c["failed"]:
        return "failed"
    return "cancelled" if c["cancelled"] else "succeeded"


def _count(status: str | tuple[str, ...]) -> sa.ColumnElement[int]:
    cond = Run.status.in_(status) if isinstance(status, tuple) else Run.status == status
    return sa.func.sum(sa.case((cond, 1), else_=0))


def _status_expr() -> sa.ScalarSelect[str]:
    """Correlated subquery: the derived status of each experiment row (mirrors `derive_status`)."""
    total, queued = sa.func.count(Run.id), _count("queued")
    ended = _count(("succeeded", "failed", "cancelled"))
    status = sa.case(
        (sa.or_(total == 0, queued == total), "queued"),
        (ended < total, "running"),
        (_count("failed") > 0, "failed"),
        (_count("cancelled") > 0, "cancelled"),
        else_="succeeded",
    )
    return sa.select(status).where(Run.experiment_id == Experiment.id).correlate(Experiment).scalar_subquery()


def create_experiment(
    session: Session,
    spec: ExperimentSpec,
    runs: Sequence[RunSpec],
    queue: str,
    *,
    source: str = "api",
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    suite_id: int | None = None,
) -> tuple[Experiment, list[int]]:
    """Insert an experiment and its runs (status queued, undispatched) in two statements; returns run ids."""
    exp = Experiment(
        name=spec.name,
        cluster=spec.cluster,
        spec=spec.model_dump(mode="json"),
        tags=list(spec.tags),
        source=source,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        suite_id=suite_id,
        created_at=utcnow(),
    )
    session.add(exp)
    session.flush()
    now = utcnow()
    rows = [
        {
            "experiment_id": exp.id,
            "run_key": r.run_key(),
            "spec": r.model_dump(mode="json"),
            "precision": r.precision,
            "layout": r.layout,
            "num_devices": r.num_devices,
            "repeat": r.repeat,
            "cluster": r.cluster,
            "queue": queue,
            "status": "queued",
            "cancel_requested": False,
            "attempts": 0,
            "created_at": now,
            "imported": source == "import",
        }
        for r in runs
    ]
    run_ids = list(session.scalars(sa.insert(Run).returning(Run.id, sort_by_parameter_order=True), rows))
    return exp, run_ids


def get_experiment(session: Session, experiment_id: int) -> Experiment | None:
    return session.get(Experiment, experiment_id)


def scoped_idempotency_key(token_id: int, key: str) -> str:
    """What is stored for a client's Idempotency-Key: the key of one token (another token's same key is another
    request: it never gets this token's experiment back), hashed to a fixed length."""
    return f"t{token_id}:" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


def find_by_idempotency_key(session: Session, key: str) -> Experiment | None:
    return session.scalars(sa.select(Experiment).where(Experiment.idempotency_key == key)).first()


def experiment_status(session: Session, experiment_id: int) -> ExperimentStatus:
    stmt = sa.select(Run.status, sa.func.count()).where(Run.experiment_id == experiment_id).group_by(Run.status)
    counts = {s: 0 for s in RUN_STATUSES} | {s: n for s, n in session.execute(stmt)}
    return ExperimentStatus(status=derive_status(counts), counts=counts)


@functools.cache
def _experiment_with_counts() -> sa.Select[*tuple[Any, ...]]:
    # Built once: constructing this statement costs more CPU than running it on a small experiment.
    counts = [sa.func.coalesce(_count(s), 0).label(s) for s in RUN_STATUSES]
    return (
        sa.select(Experiment, *counts)
        .outerjoin(Run, Run.experiment_id == Experiment.id)
        .where(Experiment.id == sa.bindparam("experiment_id"))
        .group_by(Experiment.id)
    )


def experiment_with_status(session: Session, experiment_id: int) -> tuple[Experiment, ExperimentStatus] | None:
    """An experiment and its run counts in one round trip (the hot read of dashboards that poll)."""
    row = session.execute(_experiment_with_counts(), {"experiment_id": experiment_id}).first()
    if row is None:
        return None
    by_status = {s: int(row._mapping[s]) for s in RUN_STATUSES}
    return row[0], ExperimentStatus(status=derive_status(by_status), counts=by_status)


def statuses_for(session: Session, experiment_ids: Sequence[int]) -> dict[int, ExperimentStatus]:
    """Derived status and counts of several experiments in one query."""
    if not experiment_ids:
        return {}
    stmt = (
        sa.select(Run.experiment_id, Run.status, sa.func.count())
        .where(Run.experiment_id.in_(experiment_ids))
        .group_by(Run.experiment_id, Run.status)
    )
    counts: dict[int, dict[str, int]] = {i: {s: 0 for s in RUN_STATUSES} for i in experiment_ids}
    for exp_id, status, n in session.execute(stmt):
        counts[exp_id][status] = n
    return {i: ExperimentStatus(status=derive_status(c), counts=c) for i, c in counts.items()}


def _has_tag(session: Session, tag: str) -> sa.ColumnElement[bool]:
    if session.get_bind().dialect.name == "postgresql":
        return sa.type_coerce(Experiment.tags, JSONB).contains([tag])
    each = sa.func.json_each(Experiment.tags).table_valued("value")
    return sa.exists(sa.select(1).select_from(each).where(each.c.value == tag))


def list_experiments(
    session: Session,
    *,
    limit: int = 50,
    before_id: int | None = None,
    status: str | None = None,
    tag: str | None = None,
    cluster: str | None = None,
) -> list[Experiment]:
    """Newest first; keyset pagination on id (`before_id` is the cursor). Fetches limit + 1 rows so the
    caller knows whether another page exists."""
    stmt = sa.select(Experiment).order_by(Experiment.id.desc()).limit(limit + 1)
    if before_id is not None:
        stmt = stmt.where(Experiment.id < before_id)
    if cluster is not None:
        stmt = stmt.where(Experiment.cluster == cluster)
    if tag is not None:
        stmt = stmt.where(_has_tag(session, tag))
    if status is not None:
        stmt = stmt.where(_status_expr() == status)
    return list(session.scalars(stmt))


def list_runs(
    session: Session, experiment_id: int, *, limit: int = 500, after_id: int | None = None, status: str | None = None
) -> list[Run]:
    """Runs of an experiment in id order (keyset pagination on id, limit + 1 rows)."""
    stmt = sa.select(Run).where(Run.experiment_id == experiment_id).order_by(Run.id).limit(limit + 1)
    if after_id is not None:
        stmt = stmt.where(Run.id > after_id)
    if status is not None:
        stmt = stmt.where(Run.status == status)
    return list(session.scalars(stmt))


def run_figures(session: Session, run_ids: list[int]) -> dict[int, tuple[float, float]]:
    """(tokens/s per device, median step ms) of the runs that have a summary, by run id."""
    if not run_ids:
        return {}
    stmt = sa.select(RunSummary.run_id, RunSummary.tokens_per_sec_per_device, RunSummary.step_ms_median).where(
        RunSummary.run_id.in_(run_ids)
    )
    return {row.run_id: (row.tokens_per_sec_per_device, row.step_ms_median) for row in session.execute(stmt)}


def cancel_experiment(session: Session, experiment_id: int) -> tuple[int, int]:
    """Queued runs -> cancelled; pending/running runs get cancel_requested for their worker.

    Returns (number cancelled now, number marked for the worker).
    """
    now = utcnow()
    cancelled = rowcount(
        session.execute(
            sa.update(Run)
            .where(Run.experiment_id == experiment_id, Run.status == "queued")
            .values(status="cancelled", error_kind="cancelled", error_message="cancelled by request", finished_at=now)
            .execution_options(synchronize_session=False)
        )
    )
    marked = rowcount(
        session.execute(
            sa.update(Run)
            .where(
                Run.experiment_id == experiment_id,
                Run.status.in_(("pending", "running")),
                Run.cancel_requested.is_(False),
            )
            .values(cancel_requested=True)
            .execution_options(synchronize_session=False)
        )
    )
    return cancelled, marked


def count_stopping(session: Session, experiment_id: int) -> int:
    """Pending or running runs whose cancel was asked (by any call) and that their worker has not yet ended."""
    return int(
        session.scalar(
            sa.select(sa.func.count())
            .select_from(Run)
            .where(
                Run.experiment_id == experiment_id,
                Run.status.in_(("pending", "running")),
                Run.cancel_requested.is_(True),
            )
        )
        or 0
    )
