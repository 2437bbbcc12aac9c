"""Publishing runs to the broker, after commit, and re-publishing those a down broker left behind.

A run is published while its row is locked (SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL), and
`dispatched_at` is set only after the broker accepted the message. So the request that created the runs
and the background dispatcher never publish the same run twice; a failed publish leaves the run queued
with dispatched_at NULL for the dispatcher. (If the database fails between publish and commit, the run is
published again later: the worker's atomic claim makes that second message a no-op.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from db.models import Run, utcnow
from worker.celery_app import TASK_EXECUTE_RUN, broker_error

log = logging.getLogger(__name__)
DISPATCH_BATCH = 500


@dataclass(frozen=True)
class DispatchOutcome:
    published: list[int]
    error: str | None = None  # why publishing stopped (broker down), when it did

    @property
    def ok(self) -> bool:
        return self.error is None


def publish_run(celery: Celery, run_id: int, queue: str, producer=None) -> None:  # noqa: ANN001
    """One message per run, by task name, on the cluster's queue. Raises when the broker refuses it."""
    celery.send_task(TASK_EXECUTE_RUN, args=[run_id], queue=queue, retry=False, producer=producer)


def _lock_undispatched(session: Session, run_ids: Sequence[int] | None, limit: int) -> list[tuple[int, str]]:
    stmt = (sa.select(Run.id, Run.queue)
            .where(Run.status == "queued", Run.dispatched_at.is_(None), Run.cancel_requested.is_(False))
            .order_by(Run.id).limit(limit).with_for_update(skip_locked=True))
    if run_ids is not None:
        stmt = stmt.where(Run.id.in_(run_ids))
    return [(row.id, row.queue) for row in session.execute(stmt)]


def dispatch_runs(session: Session, celery: Celery, run_ids: Sequence[int] | None = None,
                  limit: int = DISPATCH_BATCH) -> DispatchOutcome:
    """Publish undispatched queued runs (those of `run_ids`, or any) and stamp dispatched_at.

    All or nothing per call: on a broker error nothing is stamped. The caller commits (that releases
    the row locks).
    """
    published: list[int] = []
    error = broker_error(celery)  # fail fast: a refused publish would block a request for seconds
    if error:
        return DispatchOutcome(published, error)
    rows = _lock_undispatched(session, run_ids, limit)
    if not rows:
        return DispatchOutcome(published)
    try:
        # One pipelined round trip on Redis (kombu >= 5.6 batches); other transports publish one by one.
        with celery.producer_or_acquire() as producer, producer.batch():
            for run_id, queue in rows:
                publish_run(celery, run_id, queue, producer=producer)
    except Exception as exc:  # kombu/redis raise several types for "broker unreachable"
        # A failed batch is all-or-nothing for us: none is stamped, so the dispatcher sends them again
        # (a message that did get through is then a duplicate the worker's atomic claim ignores).
        error = f"broker unreachable: {type(exc).__name__}: {exc}"
        log.warning("publishing %d runs failed; %s", len(rows), error)
        return DispatchOutcome(published, error)
    return DispatchOutcome(_stamp(session, [run_id for run_id, _ in rows]))


def _stamp(session: Session, run_ids: list[int]) -> list[int]:
    if run_ids:
        session.execute(sa.update(Run).where(Run.id.in_(run_ids)).values(dispatched_at=utcnow())
                        .execution_options(synchronize_session=False))
    return run_ids


def dispatch_pending(session_factory: sessionmaker[Session], celery: Celery,
                     limit: int = DISPATCH_BATCH) -> DispatchOutcome:
    """One pass of the background dispatcher: re-publish queued runs whose dispatched_at is NULL."""
    with session_factory() as session:
        outcome = dispatch_runs(session, celery, None, limit)
        session.commit()
    if outcome.published:
        log.info("dispatcher published %d runs", len(outcome.published))
    return outcome
