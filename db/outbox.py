"""The outbox side of publishing: which queued runs still need a broker message, and stamping those sent.

A run is published while its row is locked (SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL), and
`dispatched_at` is set only after the broker accepted the message (worker.queue.dispatch_runs). So the
request that created the runs and the scheduler's dispatcher never publish the same run twice; a failed
publish leaves the run queued with dispatched_at NULL for the dispatcher.

A message can also be lost after the broker accepted it (a Redis without an append-only file restarted).
A run that stays queued past a bound after its latest message is published again (lock_stale_dispatched):
stamping resets dispatched_at and counts the message (num_dispatches), so it happens at most once per bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.base import utcnow
from db.models import Run
from db.session import rowcount


def _lock(session: Session, where: Sequence[sa.ColumnElement[bool]], limit: int) -> list[tuple[int, str]]:
    stmt = (
        sa.select(Run.id, Run.queue)
        .where(Run.status == "queued", Run.cancel_requested.is_(False), *where)
        .order_by(Run.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [(row.id, row.queue) for row in session.execute(stmt)]


def lock_undispatched(session: Session, run_ids: Sequence[int] | None, limit: int) -> list[tuple[int, str]]:
    """(run id, queue) of queued, unpublished, uncancelled runs (of `run_ids`, or any), locked, in id order."""
    where = [Run.dispatched_at.is_(None)] + ([Run.id.in_(run_ids)] if run_ids is not None else [])
    return _lock(session, where, limit)


def lock_stale_dispatched(session: Session, published_before: datetime, limit: int) -> list[tuple[int, str]]:
    """(run id, queue) of queued, uncancelled runs whose latest message was accepted before `published_before`
    and that no worker claimed since (a claim moves them out of queued), locked, in id order."""
    return _lock(session, [Run.dispatched_at < published_before], limit)


def stamp_dispatched(session: Session, run_ids: list[int]) -> list[int]:
    """Mark runs as published (the broker accepted their messages): dispatched_at = now, one more message."""
    if run_ids:
        session.execute(
            sa.update(Run)
            .where(Run.id.in_(run_ids))
            .values(dispatched_at=utcnow(), num_dispatches=Run.num_dispatches + 1)
            .execution_options(synchronize_session=False)
        )
    return run_ids


def release(session: Session, run_id: int) -> bool:
    """A queued run's message was taken by a worker that is stopping and will not start it: undispatched again,
    so that the dispatcher publishes it anew."""
    stmt = sa.update(Run).where(Run.id == run_id, Run.status == "queued").values(dispatched_at=None)
    return rowcount(session.execute(stmt.execution_options(synchronize_session=False))) == 1
