"""The outbox side of publishing: which queued runs still need a broker message, and stamping those sent.

A run is published while its row is locked (SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL), and
`dispatched_at` is set only after the broker accepted the message (worker.queue.dispatch_runs). So the
request that created the runs and the scheduler's dispatcher never publish the same run twice; a failed
publish leaves the run queued with dispatched_at NULL for the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import Run, utcnow


def lock_undispatched(session: Session, run_ids: Sequence[int] | None, limit: int) -> list[tuple[int, str]]:
    """(run id, queue) of queued, unpublished, uncancelled runs (of `run_ids`, or any), locked, in id order."""
    stmt = (sa.select(Run.id, Run.queue)
            .where(Run.status == "queued", Run.dispatched_at.is_(None), Run.cancel_requested.is_(False))
            .order_by(Run.id).limit(limit).with_for_update(skip_locked=True))
    if run_ids is not None:
        stmt = stmt.where(Run.id.in_(run_ids))
    return [(row.id, row.queue) for row in session.execute(stmt)]


def stamp_dispatched(session: Session, run_ids: list[int]) -> list[int]:
    """Mark runs as published (the broker accepted their messages)."""
    if run_ids:
        session.execute(sa.update(Run).where(Run.id.in_(run_ids)).values(dispatched_at=utcnow())
                        .execution_options(synchronize_session=False))
    return run_ids
