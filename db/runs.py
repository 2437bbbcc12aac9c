"""Run lifecycle (what workers call): claim, heartbeat, launch details, results, failures, reaping, cancel.

Every state change is one conditional UPDATE (`WHERE status IN ...`), so that two workers, a redelivered
message, the reaper and a cancel can race without a lost update. Functions never commit: the caller does.

    queued --claim_run--> running --record_result--> succeeded | failed
       |                    |  \\--mark_failed------> failed
       |                    |   \\--reap_expired----> queued (attempts left) | failed 'worker_lost'
       |                    |    \\-requeue_detached-> queued, attempt not spent (a Slurm job outlives its worker:
       |                    |    |                     the next claim re-attaches to it, count_attempt=False)
       |                    |    \\-requeue_interrupted-> queued (its worker was stopped, SIGTERM): the run's
       |                    |                          processes were ended (attempt refunded) or its Slurm job
       |                    |                          goes on (re-attached); recorded at once, no lease wait
       \\--mark_cancelled--> cancelled  <--mark_cancelled (worker acted on cancel_requested)

Fencing: every claim increments `lease_id` and returns it; a worker names that lease in every later write
about the run (heartbeat, launch details, log, trace, result, cancel, requeue), and the write is refused
(False, nothing stored) unless the run is still active under that lease: `WHERE lease_id = :mine AND status
IN ('pending', 'running')`. A worker paused past its lease (SIGSTOP, a long GC, a frozen VM) whose run was
reaped and claimed again therefore records nothing; it stops its own attempt's processes and goes. The
lease also names the attempt's run directory (runs/run-N/lease-K/), so that no sweep of one attempt matches
another's processes. lease_id=None is a write that is not a worker's (the API, tests seeding runs).

A lease ends early (expire_leases) when its worker is known dead (its pid is gone on this host); the reaper
then takes the run as above without waiting for the lease to run out.

Which queued run a message starts: claim_candidates, the oldest published or requeued run of the message's
cluster and queue (or the message's own run), so runs of a cluster start in submission order whatever order the
broker delivers messages in, and a run requeued after its worker died keeps its place; each message still claims
at most one run and each run is claimed once (claim_run).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.contracts.specs import ERROR_KINDS, RunResult
from db.base import utcnow
from db.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run, RunLog, RunSummary, RunTrace, StepMetric
from db.points import store_loss_curve
from db.session import rowcount

log = logging.getLogger(__name__)
MAX_ERROR_MESSAGE_CHARS = 20_000
LOG_STORE_MAX_BYTES = 1 << 20  # the stored tail of a run's log (newest bytes)
TRACE_STORE_MAX_BYTES = 256 << 20  # one rank's gzipped trace; a larger one stays in the run directory only


@dataclass(frozen=True)
class LeaseState:
    """What a heartbeat learned: whether this worker still owns the run, and whether a cancel was asked."""

    owned: bool
    cancel_requested: bool


def _fence(lease_id: int | None) -> list[sa.ColumnElement[bool]]:
    """The WHERE terms of a worker's write under lease `lease_id` (none for a write that is not a worker's)."""
    return [] if lease_id is None else [Run.lease_id == lease_id, Run.status.in_(ACTIVE_STATUSES)]


def holds_lease(session: Session, run_id: int, lease_id: int) -> bool:
    """Is the run still active under this lease? Takes the run's row lock (a no-op UPDATE) until the caller
    commits, so a reaper's or another claim's UPDATE waits for the write this guards, or is seen by it."""
    return _update(session, run_id, _fence(lease_id), lease_id=Run.lease_id)


def _update(session: Session, run_id: int, where: list[sa.ColumnElement[bool]], **values: Any) -> bool:
    stmt = sa.update(Run).where(Run.id == run_id, *where).values(**values)
    return rowcount(session.execute(stmt.execution_options(synchronize_session=False))) == 1


def claim_run(
    session: Session,
    run_id: int,
    worker: str,
    host: str,
    lease_s: float,
    now: datetime | None = None,
    count_attempt: bool = True,
) -> int | None:
    """queued -> running with a lease, in one atomic UPDATE: the new lease id (>= 1), the fence the worker names
    in every later write about the run. None: someone else has it (or it is gone).

    count_attempt=False: the worker re-attaches to a Slurm job submitted by an earlier claim (no new launch),
    so neither the attempt count nor started_at changes."""
    now = now or utcnow()
    stmt = (
        sa.update(Run)
        .where(Run.id == run_id, Run.status == "queued", Run.cancel_requested.is_(False))
        .values(
            status="running",
            attempts=Run.attempts + int(count_attempt),
            lease_id=Run.lease_id + 1,
            worker=worker,
            host=host,
            started_at=now if count_attempt else sa.func.coalesce(Run.started_at, now),
            heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=lease_s),
            finished_at=None,
            error_kind=None,
            error_message=None,
        )
        .returning(Run.dispatched_at, Run.num_dispatches, Run.queue, Run.cluster, Run.lease_id)
    )
    row = session.execute(stmt.execution_options(synchronize_session=False)).first()
    if row is None:
        return None
    if row.dispatched_at is None and row.num_dispatches > 0:  # requeued: it started on another run's message
        _give_back_a_message(session, row.queue, row.cluster)
    lease_id: int = row.lease_id
    return lease_id


def _requeued() -> sa.ColumnElement[bool]:
    """Queued again with no message of its own in flight (reaped, retried, interrupted or released): it was
    published before (num_dispatches > 0) and its message was consumed."""
    return sa.and_(Run.dispatched_at.is_(None), Run.num_dispatches > 0)


def _give_back_a_message(session: Session, queue: str, cluster: str) -> None:
    """A requeued run took a message that a published run was counting on: the newest published queued run of
    the queue is marked unpublished, so that the dispatcher publishes one more message for it. Every published
    run keeps a message in flight, and the requeued run did not wait behind runs submitted after it."""
    newest = (
        sa.select(Run.id)
        .where(
            Run.queue == queue,
            Run.cluster == cluster,
            Run.status == "queued",
            Run.dispatched_at.is_not(None),
            Run.cancel_requested.is_(False),
        )
        .order_by(Run.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    session.execute(
        sa.update(Run).where(Run.id == newest).values(dispatched_at=None).execution_options(synchronize_session=False)
    )


def claim_candidates(session: Session, run_id: int, exclude: Collection[int] = (), limit: int = 20) -> list[int]:
    """Queued runs a message for `run_id` may start, oldest first: uncancelled runs of its cluster and queue
    whose message was published or that were requeued (their message consumed: reaped after a worker died,
    retried, interrupted), and run_id itself.

    Claiming the oldest keeps submission order whatever order the broker delivers in, and a requeued run keeps
    its place instead of waiting for the dispatcher to publish it again. The count still adds up: a message
    starts one published run, so every published run keeps a message of its own cluster; a requeued run that
    takes one makes the newest published run give its message back (claim_run). Runs never published yet are
    not taken by another run's message (their publisher is sending one); so a message delivered in the
    milliseconds before its publisher committed dispatched_at starts its own run."""
    own = session.execute(sa.select(Run.queue, Run.cluster).where(Run.id == run_id)).first()
    if own is None:
        return []
    stmt = (
        sa.select(Run.id)
        .where(
            Run.queue == own.queue,
            Run.cluster == own.cluster,
            Run.status == "queued",
            Run.cancel_requested.is_(False),
            sa.or_(Run.dispatched_at.is_not(None), _requeued(), Run.id == run_id),
        )
        .order_by(Run.id)
        .limit(limit)
    )
    if exclude:
        stmt = stmt.where(Run.id.not_in(list(exclude)))
    return list(session.scalars(stmt))


def heartbeat(
    session: Session,
    run_id: int,
    lease_s: float,
    worker: str | None = None,
    now: datetime | None = None,
    *,
    lease_id: int | None = None,
) -> LeaseState:
    """Extend the lease of an active run (held under `lease_id`, owned by `worker`, when given); report a
    pending cancel. owned=False: the run moved on (reaped, requeued, claimed again, ended)."""
    now = now or utcnow()
    where = [Run.status.in_(ACTIVE_STATUSES), *_fence(lease_id)] + ([Run.worker == worker] if worker else [])
    stmt = (
        sa.update(Run)
        .where(Run.id == run_id, *where)
        .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Run.cancel_requested)
    )
    row = session.execute(stmt.execution_options(synchronize_session=False)).first()
    return LeaseState(owned=row is not None, cancel_requested=bool(row and row[0]))


def update_launch(
    session: Session,
    run_id: int,
    *,
    status: str | None = None,
    run_dir: str | None = None,
    slurm_job_id: str | None = None,
    lease_id: int | None = None,
) -> bool:
    """Record where an active run lives (run dir, Slurm job id) and pending <-> running moves. False: not
    active (under `lease_id`) any more."""
    if status is not None and status not in ACTIVE_STATUSES:
        raise ValueError(f"status: {status!r} is not allowed here; allowed: {', '.join(ACTIVE_STATUSES)}")
    values = {
        k: v for k, v in {"status": status, "run_dir": run_dir, "slurm_job_id": slurm_job_id}.items() if v is not None
    }
    if not values:
        return False
    return _update(session, run_id, [Run.status.in_(ACTIVE_STATUSES), *_fence(lease_id)], **values)


def _check_kind(kind: str) -> None:
    if kind not in ERROR_KINDS:
        raise ValueError(f"error kind: {kind!r} is not one of: {', '.join(ERROR_KINDS)}")


def mark_failed(
    session: Session,
    run_id: int,
    kind: str,
    message: str,
    now: datetime | None = None,
    *,
    lease_id: int | None = None,
) -> bool:
    """Any non-terminal run (active under `lease_id` when given) -> failed(kind, message). False when it had
    already ended (or moved on)."""
    _check_kind(kind)
    return _update(
        session,
        run_id,
        [Run.status.not_in(TERMINAL_STATUSES), *_fence(lease_id)],
        status="failed",
        error_kind=kind,
        error_message=message[:MAX_ERROR_MESSAGE_CHARS],
        finished_at=now or utcnow(),
        lease_expires_at=None,
    )


def mark_cancelled(
    session: Session,
    run_id: int,
    message: str = "cancelled by request",
    now: datetime | None = None,
    *,
    lease_id: int | None = None,
) -> bool:
    """Any non-terminal run -> cancelled (a queued run, or a running one whose worker stopped it: that worker
    names its lease)."""
    return _update(
        session,
        run_id,
        [Run.status.not_in(TERMINAL_STATUSES), *_fence(lease_id)],
        status="cancelled",
        error_kind="cancelled",
        error_message=message,
        finished_at=now or utcnow(),
        lease_expires_at=None,
    )


def _store_metrics(session: Session, run_id: int, result: RunResult) -> None:
    session.execute(sa.delete(StepMetric).where(StepMetric.run_id == run_id))
    session.execute(sa.delete(RunSummary).where(RunSummary.run_id == run_id))
    if result.steps:
        rows = [{"run_id": run_id, **s.model_dump()} for s in result.steps]
        session.execute(sa.insert(StepMetric), rows)
    if result.summary is not None:
        final_loss = result.numerics.final_loss if result.numerics else None  # a column, for the scaling reads
        session.execute(
            sa.insert(RunSummary).values(run_id=run_id, final_loss=final_loss, **result.summary.model_dump())
        )
    held_out = [(p.step, p.loss) for p in result.numerics.eval_curve] if result.numerics else []
    store_loss_curve(session, run_id, [(s.step, s.loss) for s in result.steps if s.loss is not None], held_out)


def record_result(
    session: Session, run_id: int, result: RunResult, now: datetime | None = None, *, lease_id: int | None = None
) -> bool:
    """Store a RunResult (summary, steps, result JSON) and end the run succeeded | failed.

    False (nothing stored) when the run had already ended, e.g. cancelled or reaped as lost meanwhile, or (a
    worker's write, `lease_id` given) is no longer active under that lease: reaped, requeued, claimed again.
    """
    error = result.error
    ok = _update(
        session,
        run_id,
        [Run.status.not_in(TERMINAL_STATUSES), *_fence(lease_id)],
        status=result.status,
        result=result.model_dump(mode="json", exclude={"steps"}),
        error_kind=error.kind if error else None,
        error_message=error.message[:MAX_ERROR_MESSAGE_CHARS] if error else None,
        finished_at=now or utcnow(),
        lease_expires_at=None,
    )
    if ok:
        _store_metrics(session, run_id, result)
    return ok


@dataclass(frozen=True)
class Reaped:
    requeued: list[int]
    failed: list[int]  # failed worker_lost, or cancelled (a cancel was pending)
    run_dirs: dict[int, str | None]  # each reaped run's directory as it was when reaped (its last attempt's)


def reap_expired(session: Session, now: datetime | None = None, max_attempts: int = 3) -> tuple[list[int], list[int]]:
    """Active runs whose lease expired: back to queued (undispatched) while attempts remain, else failed.

    Returns (requeued run ids, failed run ids). A run with a pending cancel is cancelled instead.
    """
    reaped = reap_expired_runs(session, now, max_attempts)
    return reaped.requeued, reaped.failed


def reap_expired_runs(session: Session, now: datetime | None = None, max_attempts: int = 3) -> Reaped:
    """reap_expired, with the run directory of each reaped attempt read in the same UPDATE: the reaper ends
    the leftover processes of that attempt only, never those of a retry claimed a moment later."""
    now = now or utcnow()
    dirs: dict[int, str | None] = {}
    expired = [Run.status.in_(ACTIVE_STATUSES), Run.lease_expires_at < now]
    cancelled = _bulk(
        session,
        expired + [Run.cancel_requested.is_(True)],
        dirs=dirs,
        status="cancelled",
        error_kind="cancelled",
        error_message="cancelled (worker lost)",
        finished_at=now,
    )
    failed = _bulk(
        session,
        expired + [Run.attempts >= max_attempts],
        dirs=dirs,
        status="failed",
        error_kind="worker_lost",
        error_message=f"worker lost: lease expired after {max_attempts} attempt(s)",
        finished_at=now,
    )
    requeued = _bulk(
        session,
        expired,
        dirs=dirs,
        status="queued",
        dispatched_at=None,
        worker=None,
        host=None,
        error_kind=None,
        error_message=None,
    )
    if requeued or failed or cancelled:
        log.warning("reaped expired leases: requeued %s, failed %s, cancelled %s", requeued, failed, cancelled)
    return Reaped(requeued, failed + cancelled, dirs)


def requeue_detached(session: Session, run_ids: list[int], now: datetime | None = None) -> list[int]:
    """Expired active runs whose work goes on without their worker (a submitted Slurm job) -> queued, undispatched.

    Neither failed nor counted as an attempt: the job does not depend on the worker that died, and the next
    claim re-attaches to it. A run with a pending cancel is left to reap_expired (cancelled, job scancelled).
    Returns the ids requeued."""
    if not run_ids:
        return []
    now = now or utcnow()
    where = [
        Run.id.in_(run_ids),
        Run.status.in_(ACTIVE_STATUSES),
        Run.lease_expires_at < now,
        Run.cancel_requested.is_(False),
    ]
    requeued = _bulk(session, where, status="queued", dispatched_at=None, worker=None, host=None)
    if requeued:
        log.warning("expired leases of runs with a live launch (Slurm job): requeued to re-attach %s", requeued)
    return requeued


def requeue_interrupted(
    session: Session, run_id: int, worker: str, reason: str, refund_attempt: bool, *, lease_id: int | None = None
) -> bool:
    """running|pending (owned by `worker`) -> queued, undispatched, at once: its worker is shutting down.

    refund_attempt: the run's processes were ended by us (not the run's fault), so the attempt is given back
    and the next claim launches it afresh; False for a Slurm job that goes on (the next claim re-attaches and
    spends nothing). A run with a pending cancel is left to mark_cancelled."""
    stmt = (
        sa.update(Run)
        .where(
            Run.id == run_id,
            Run.status.in_(ACTIVE_STATUSES),
            Run.worker == worker,
            Run.cancel_requested.is_(False),
            *_fence(lease_id),
        )
        .values(
            status="queued",
            dispatched_at=None,
            worker=None,
            host=None,
            lease_expires_at=None,
            attempts=Run.attempts - int(refund_attempt),
            error_kind=None,
            error_message=f"requeued: {reason}"[:2000],
        )
    )
    return rowcount(session.execute(stmt.execution_options(synchronize_session=False))) == 1


def expire_leases(session: Session, owners: list[tuple[int, str]], now: datetime | None = None) -> list[int]:
    """End now the leases of active runs whose worker is known dead: (run id, worker) pairs; a run claimed by
    another worker meanwhile is left alone. The reaper then requeues or fails them (reap_expired)."""
    now = now or utcnow()
    expired = []
    for run_id, worker in owners:
        if _update(
            session,
            run_id,
            [Run.status.in_(ACTIVE_STATUSES), Run.worker == worker],
            lease_expires_at=now - timedelta(microseconds=1),
        ):
            expired.append(run_id)
    return expired


def requeue_for_retry(session: Session, run_id: int, reason: str, *, lease_id: int | None = None) -> bool:
    """running|pending (under `lease_id` when given) -> queued (undispatched) for another attempt after an
    infrastructure failure (node failure, preemption), unless a cancel is pending."""
    stmt = (
        sa.update(Run)
        .where(Run.id == run_id, Run.status.in_(ACTIVE_STATUSES), Run.cancel_requested.is_(False), *_fence(lease_id))
        .values(
            status="queued",
            dispatched_at=None,
            worker=None,
            host=None,
            lease_expires_at=None,
            error_kind=None,
            error_message=f"retrying after an infrastructure failure: {reason}"[:2000],
        )
    )
    return rowcount(session.execute(stmt.execution_options(synchronize_session=False))) == 1


def cancel_requested(session: Session, run_id: int) -> bool:
    return bool(session.scalar(sa.select(Run.cancel_requested).where(Run.id == run_id)))


def active_runs_with_dir(session: Session) -> list[Run]:
    """Runs a worker owns (pending, running) that have a run directory: candidates for recovery."""
    return list(session.scalars(sa.select(Run).where(Run.status.in_(ACTIVE_STATUSES), Run.run_dir.is_not(None))))


def expired_active_runs(session: Session, now: datetime) -> list[sa.Row[*tuple[Any, ...]]]:
    """(id, cluster, run_dir, created_at, attempts, lease_id) of active runs whose lease expired and that have no
    pending cancel."""
    return list(
        session.execute(
            sa.select(Run.id, Run.cluster, Run.run_dir, Run.created_at, Run.attempts, Run.lease_id).where(
                Run.status.in_(ACTIVE_STATUSES), Run.lease_expires_at < now, Run.cancel_requested.is_(False)
            )
        )
    )


def active_runs_on_host(session: Session, host: str) -> list[tuple[int, str]]:
    """(id, worker) of active runs whose worker runs on `host` (whose liveness this host can check)."""
    stmt = sa.select(Run.id, Run.worker).where(
        Run.status.in_(ACTIVE_STATUSES), Run.host == host, Run.worker.is_not(None)
    )
    return [(row.id, row.worker) for row in session.execute(stmt)]


def _bulk(
    session: Session,
    where: list[sa.ColumnElement[bool]],
    dirs: dict[int, str | None] | None = None,
    **values: Any,
) -> list[int]:
    """One UPDATE of every run matching `where`; their ids (and, into `dirs`, their run_dir before it)."""
    stmt = sa.update(Run).where(*where).values(lease_expires_at=None, **values).returning(Run.id, Run.run_dir)
    rows = session.execute(stmt.execution_options(synchronize_session=False)).all()
    if dirs is not None:
        dirs.update({row.id: row.run_dir for row in rows})
    return [row.id for row in rows]


def get_run(session: Session, run_id: int) -> Run | None:
    return session.get(Run, run_id)


def get_steps(session: Session, run_id: int) -> list[StepMetric]:
    stmt = sa.select(StepMetric).where(StepMetric.run_id == run_id).order_by(StepMetric.step)
    return list(session.scalars(stmt))


def get_summary(session: Session, run_id: int) -> RunSummary | None:
    return session.get(RunSummary, run_id)


def store_log(
    session: Session, run_id: int, tail: bytes, log_bytes: int, *, final: bool = False, lease_id: int | None = None
) -> bool:
    """Store the newest LOG_STORE_MAX_BYTES of a run's log (decoded leniently; NUL is not valid in text
    columns). A final tail is never replaced by a later live one. False (nothing stored): the run is not active
    under `lease_id` any more (a stale worker's log must not replace the retry's)."""
    if lease_id is not None and not holds_lease(session, run_id, lease_id):
        return False
    text = tail[-LOG_STORE_MAX_BYTES:].decode("utf-8", "replace").replace("\x00", "\ufffd")
    row = session.get(RunLog, run_id)
    if row is None:
        session.add(RunLog(run_id=run_id, text=text, log_bytes=log_bytes, final=final, updated_at=utcnow()))
    elif final or not row.final:
        row.text, row.log_bytes, row.final, row.updated_at = text, log_bytes, final, utcnow()
    return True


def get_log(session: Session, run_id: int) -> RunLog | None:
    return session.get(RunLog, run_id)


def store_trace(session: Session, run_id: int, rank: int, data_gzip: bytes, *, lease_id: int | None = None) -> bool:
    """Store (or replace) one rank's gzipped chrome trace; ValueError when it is over TRACE_STORE_MAX_BYTES.
    False (nothing stored): the run is not active under `lease_id` any more."""
    if len(data_gzip) > TRACE_STORE_MAX_BYTES:
        raise ValueError(
            f"trace of rank {rank}: {len(data_gzip)} bytes gzipped, over the store's limit of "
            f"{TRACE_STORE_MAX_BYTES} bytes"
        )
    if lease_id is not None and not holds_lease(session, run_id, lease_id):
        return False
    row = session.get(RunTrace, (run_id, rank))
    if row is None:
        session.add(
            RunTrace(run_id=run_id, rank=rank, data_gzip=data_gzip, gzip_bytes=len(data_gzip), created_at=utcnow())
        )
    else:
        row.data_gzip, row.gzip_bytes, row.created_at = data_gzip, len(data_gzip), utcnow()
    return True


def get_trace(session: Session, run_id: int, rank: int) -> RunTrace | None:
    return session.get(RunTrace, (run_id, rank))


def trace_ranks(session: Session, run_id: int) -> list[int]:
    """Ranks whose trace of this run is stored (no trace bytes read)."""
    stmt = sa.select(RunTrace.rank).where(RunTrace.run_id == run_id).order_by(RunTrace.rank)
    return list(session.scalars(stmt))


@dataclass(frozen=True)
class BreakdownRow:
    run_id: int
    precision: str
    layout: str
    num_devices: int
    repeat: int
    breakdown: dict[str, Any]  # core.analysis.breakdown.Breakdown as JSON


def breakdown_rows(session: Session, experiment_id: int) -> list[BreakdownRow]:
    """Succeeded runs of an experiment that carry a step breakdown (profiled runs), one query."""
    col = Run.result["breakdown"]
    stmt = (
        sa.select(Run.id, Run.precision, Run.layout, Run.num_devices, Run.repeat, col)
        .where(Run.experiment_id == experiment_id, Run.status == "succeeded")
        .order_by(Run.id)
    )
    return [
        BreakdownRow(run_id, precision, layout, n, repeat, b)
        for run_id, precision, layout, n, repeat, b in session.execute(stmt)
        if b
    ]
