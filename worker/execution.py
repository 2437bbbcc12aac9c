"""What a worker does with one run: claim, launch, watch (heartbeat, cancel, deadline), record the outcome.

The Celery task (worker/tasks.py) is a thin adapter over `execute_run`. Every DB write is its own short
transaction; the run's process never waits on the database: if Postgres is down when the run ends,
result.json stays in the run directory and recording is retried with backoff until the database is back
(and `recover_finished_runs` records it after a worker restart).

A message names a run, but the worker starts the oldest claimable run of that run's cluster
(db.runs.claim_candidates), so runs start in submission order whatever order the broker delivers in.
When the worker is told to stop (SIGTERM, `request_shutdown`), a watched run is not waited for: a local
run's processes are ended and the run is requeued at once with its attempt given back; a Slurm job goes on
and its run is requeued for the next worker to re-attach to.

Fencing: the claim gives this worker a lease id (db.runs.claim_run) and a run directory of its own
(runs/run-N/lease-K/); every later write about the run names the lease, and the store refuses it once the
run has moved on (reaped while this worker was paused, requeued, claimed by another worker). A refused
write ends this attempt's processes (those whose argv names its own spec.json: another attempt's never
match) and records nothing more: the run's record belongs to whoever holds it now.
"""

from __future__ import annotations

import functools
import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

import db.runs
from core.contracts.specs import ErrorKind, RunError, RunResult, RunSpec
from db import outbox
from db.session import session_scope
from worker.launchers.base import Launcher, LaunchHandle, LaunchOutcome, read_log_tail, trace_files
from worker.runtime import Runtime

log = logging.getLogger(__name__)
T = TypeVar("T")
CANCEL_CHECK_S = 1.0  # how often the cancel flag is read (cancel must end the run within 10 s)
POLL_S = 0.25
DB_RETRY_MAX_S = 5.0
TAIL_IN_MESSAGE_CHARS = 2000
LOG_SHIP_S = 2.0  # how often a running run's log tail is shipped to the store (when it grew)
# A stopping worker ends a local run's processes with this grace before SIGKILL: the attempt is given back
# anyway, and torchrun's own SIGTERM teardown took ~3 s here (a stop of `up` must finish within a few seconds).
# The same grace ends the teardown of a run that already succeeded when the worker is stopping.
SHUTDOWN_KILL_GRACE_S = 1.0


def with_db(rt: Runtime, fn: Callable[[Session], T], what: str, retry_forever: bool = False) -> T:
    """Run fn in one transaction; on a lost/refused connection retry with backoff (forever if asked)."""
    delay_s = 0.25
    while True:
        try:
            with session_scope(rt.session_factory) as session:
                return fn(session)
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            if not retry_forever:
                raise
            log.warning("%s: database unavailable (%s); retrying in %.1f s", what, exc.__class__.__name__, delay_s)
            time.sleep(delay_s)
            delay_s = min(DB_RETRY_MAX_S, delay_s * 2)


def request_shutdown() -> None:
    """The worker is stopping (SIGTERM): watched runs are interrupted and requeued at once (see _interrupt)."""
    _shutdown.set()


def shutdown_requested() -> bool:
    return _shutdown.is_set()


def busy() -> bool:
    """Is a message being handled in this process now (execute_run)?"""
    return _num_active > 0


_shutdown = threading.Event()
_active_lock = threading.Lock()
_num_active = 0  # execute_run calls in progress in this process (threads pool: several)


def execute_run(rt: Runtime, run_id: int, republish: Callable[[int], None] | None = None) -> str:
    """A message for run_id: claim the oldest claimable run of its cluster (usually run_id itself) and execute
    it; returns what happened ('skipped', or the final status).

    A run that already has a live Slurm job (its worker died and the reaper requeued it, or its message came
    again) is re-attached to that job, never submitted again; the claim then spends no attempt."""
    global _num_active
    with _active_lock:
        _num_active += 1
    try:
        return _execute(rt, run_id, republish)
    finally:
        with _active_lock:
            _num_active -= 1


def _execute(rt: Runtime, run_id: int, republish: Callable[[int], None] | None) -> str:
    if _shutdown.is_set():  # a message taken while stopping: give it back to the outbox, start nothing
        with_db(rt, lambda s: outbox.release(s, run_id), f"run {run_id}: release")
        log.info("run %d: worker stopping: message given back (the dispatcher publishes it again)", run_id)
        return "skipped"
    claimed = _claim_next(rt, run_id)
    if claimed is None:
        log.info(
            "run %d: not claimable (already claimed, finished, cancelled or gone) and no other run of its "
            "cluster waits: nothing to do",
            run_id,
        )
        return "skipped"
    if claimed[0] != run_id:
        log.info("message for run %d: starting run %d, the oldest queued run of its cluster", run_id, claimed[0])
    run_id, lease, attached = claimed
    run = with_db(rt, lambda s: db.runs.get_run(s, run_id), f"run {run_id}: read")
    assert run is not None
    try:
        spec = RunSpec.model_validate(run.spec)
        cluster = rt.cluster(run.cluster)
        launcher = rt.launcher(cluster)
        if attached is not None:
            handle, run_dir = attached, Path(attached.run_dir)
            log.warning(
                "run %d: re-attached to Slurm job %s (submitted by an earlier claim; last state %s)",
                run_id,
                handle.job_id,
                handle.extra.get("last_state"),
            )
        else:
            run_dir = rt.run_dir(cluster, run_id, lease)
            if run_dir.exists() and _left_by_another_database(run_dir, run.created_at):
                run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{int(time.time())}"))
            handle = launcher.start(spec, str(run_id), run_dir)
    except Exception as exc:  # noqa: BLE001 - recorded, never swallowed
        log.exception("run %d: launch failed", run_id)
        _record_failure(rt, run_id, lease, run.spec, "launch_error", f"launch failed: {exc}", "")
        return "failed"
    if not with_db(
        rt,
        lambda s: db.runs.update_launch(
            s, run_id, run_dir=str(run_dir), slurm_job_id=handle.job_id or None, lease_id=lease
        ),
        f"run {run_id}: launch details",
        retry_forever=True,
    ):
        _stop(rt, run_id, lease, launcher, handle, owned=False)
        return "superseded"
    outcome = _watch(rt, run_id, lease, launcher, handle)
    if isinstance(outcome, str):  # cancelled, superseded, or interrupted by the worker's shutdown
        return outcome
    _mark_ended(handle, outcome.state)
    status = _finish(rt, run_id, lease, run.spec, run.attempts, outcome, republish)
    if hasattr(launcher, "finish"):  # the result was visible first; the node is free after teardown
        launcher.finish(handle, stop_waiting=_shutdown.is_set)  # a stopping worker does not wait for it
    return status


def _claim_next(rt: Runtime, message_run_id: int) -> tuple[int, int, LaunchHandle | None] | None:
    """Claim the oldest claimable run for this message (db.runs.claim_candidates): (run id, lease id, the Slurm
    job's handle to re-attach to or None), or None when there is nothing to claim. A claim that launches
    records its run directory (run-N/lease-K) in the claim's transaction, before anything is submitted, so a
    Slurm job found later by its name is looked for where it was started. Racing workers are fine: the
    claim is one conditional UPDATE; the loser tries the next candidate."""
    tried: set[int] = set()
    while True:
        candidates = with_db(
            rt,
            lambda s: db.runs.claim_candidates(s, message_run_id, exclude=tried),
            f"run {message_run_id}: claim candidates",
        )
        if not candidates:
            return None
        for run_id in candidates:
            tried.add(run_id)
            try:
                attached = _find_attachable(rt, run_id)
            except RuntimeError as exc:  # Slurm cannot be asked: a job may exist, so none is submitted now
                log.warning(
                    "run %d: cannot tell whether a Slurm job was submitted for it (%s): left queued "
                    "(the scheduler publishes it again later)",
                    run_id,
                    exc,
                )
                continue

            def claim(s: Session, i: int = run_id, a: LaunchHandle | None = attached) -> int | None:
                lease = db.runs.claim_run(s, i, rt.worker_name, rt.host, rt.settings.lease_s, count_attempt=a is None)
                run = db.runs.get_run(s, i) if lease is not None and a is None else None
                if lease is not None and run is not None and run.cluster in rt.clusters:
                    run_dir = rt.run_dir(rt.clusters[run.cluster], i, lease)
                    db.runs.update_launch(s, i, run_dir=str(run_dir), lease_id=lease)
                return lease

            if lease := with_db(rt, claim, f"run {run_id}: claim"):
                return run_id, lease, attached


def _left_by_another_database(run_dir: Path, created_at: datetime) -> bool:
    """A run directory older than the run itself was left by a previous database with the same run ids."""
    created_s = (created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)).timestamp()
    try:
        handle = LaunchHandle.load(run_dir)
        written_s = handle.started_at if handle is not None else run_dir.stat().st_mtime
    except (OSError, ValueError, TypeError):
        return True
    return written_s < created_s


def attachable_handle(run_dir: str | Path, run_id: int, created_at: datetime) -> LaunchHandle | None:
    """The handle of a Slurm job submitted for this run whose outcome no worker has taken yet, else None.

    A handle written before the run was created belongs to a previous database with the same run ids."""
    try:
        handle = LaunchHandle.load(run_dir)
    except (OSError, ValueError, TypeError) as exc:  # unreadable or from another version: launch afresh
        log.warning("run %d: handle in %s unreadable (%s): not re-attaching", run_id, run_dir, exc)
        return None
    if handle is None or handle.launcher != "slurm" or not handle.job_id or handle.run_id != str(run_id):
        return None
    created_s = (created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)).timestamp()
    if handle.extra.get("ended") or handle.started_at < created_s:
        return None
    return handle


def _find_attachable(rt: Runtime, run_id: int) -> LaunchHandle | None:
    """Before claiming: does this queued run already have a Slurm job to re-attach to?"""
    run = with_db(rt, lambda s: db.runs.get_run(s, run_id), f"run {run_id}: read before claim")
    if run is None or run.status != "queued" or run.cluster not in rt.clusters:
        return None  # the claim (or the launch) says what is wrong
    cluster = rt.clusters[run.cluster]
    if cluster.launcher != "slurm":
        return None  # a local run's processes died with their worker: it is launched again
    run_dir = run.run_dir or rt.run_dir(cluster, run_id, run.lease_id)
    return find_slurm_job(rt, cluster, run_id, run_dir, run.created_at, run.attempts)


def find_slurm_job(
    rt: Runtime, cluster, run_id: int, run_dir: str | Path, created_at: datetime, attempts: int
) -> LaunchHandle | None:
    """The Slurm job a run can be re-attached to: from handle.json, else (a worker died after sbatch returned
    and before it wrote handle.json) found by its job name. Raises RuntimeError (SlurmError) when Slurm
    cannot be asked."""
    handle = attachable_handle(run_dir, run_id, created_at)
    if handle is not None or attempts == 0:
        return handle  # never claimed: no job can have been submitted for it
    try:
        previous = LaunchHandle.load(run_dir)  # a job whose outcome was taken (an infrastructure retry)
    except (OSError, ValueError, TypeError):
        previous = None
    created_s = (created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)).timestamp()
    ours = previous is not None and previous.launcher == "slurm" and previous.run_id == str(run_id)
    newer_than = previous.job_id if ours and previous is not None and previous.job_id else None
    from worker.launchers.slurm import SlurmLauncher  # only workers of Slurm clusters need it

    launcher = rt.launcher(cluster)
    assert isinstance(launcher, SlurmLauncher), f"cluster {cluster.name!r} does not launch with slurm"
    return launcher.find_job(str(run_id), run_dir, created_s, newer_than_job=newer_than)


def _mark_ended(handle: LaunchHandle, state: str) -> None:
    """A Slurm job whose outcome was taken is not re-attached again (e.g. after an infrastructure retry)."""
    if handle.launcher != "slurm":
        return
    handle.extra["ended"] = state
    try:
        handle.save()
    except OSError as exc:  # shared dir unreachable: the outcome is still recorded; a retry may re-attach once
        log.warning("run %s: could not mark %s ended (%s)", handle.run_id, handle.run_dir, exc)


def _watch(rt: Runtime, run_id: int, lease: int, launcher, handle: LaunchHandle) -> LaunchOutcome | str:
    """Poll until the run ends; heartbeat; act on cancel and on the worker's shutdown. A status string
    instead of an outcome when the run was cancelled, taken away ('superseded': the store refused a write
    under this lease) or interrupted (requeued)."""
    next_heartbeat = next_cancel_check = next_log = 0.0
    last_state = "running"
    shipped = LogShipper(rt, run_id, handle.run_dir, lease)
    while True:
        outcome = launcher.poll(handle)
        if outcome.state not in ("pending", "running"):
            if not shipped.ship(final=True) or ship_traces(rt, run_id, handle.run_dir, lease) is None:
                return _superseded(rt, run_id, lease, launcher, handle, "its processes ended")
            return outcome
        if _shutdown.is_set():
            return _interrupt(rt, run_id, lease, launcher, handle, shipped)
        now = time.monotonic()
        if now >= next_log:
            next_log = now + LOG_SHIP_S
            if shipped.ship() is False:
                return _superseded(rt, run_id, lease, launcher, handle, "log shipping")
        if outcome.state != last_state:  # Slurm: pending <-> running
            last_state = outcome.state
            moved = _try_db(
                rt,
                functools.partial(db.runs.update_launch, run_id=run_id, status=outcome.state, lease_id=lease),
                f"run {run_id}: state",
            )
            if moved is False:
                return _superseded(rt, run_id, lease, launcher, handle, "state change")
        if now >= next_heartbeat:
            next_heartbeat = now + rt.settings.heartbeat_s
            state = _try_db(
                rt,
                lambda s: db.runs.heartbeat(s, run_id, rt.settings.lease_s, rt.worker_name, lease_id=lease),
                f"run {run_id}: heartbeat",
            )
            if state is not None and not state.owned:
                return _superseded(rt, run_id, lease, launcher, handle, "heartbeat")
            if state is not None and state.cancel_requested:
                _stop(rt, run_id, lease, launcher, handle, owned=True, shipped=shipped)
                return "cancelled"
        elif now >= next_cancel_check:
            next_cancel_check = now + CANCEL_CHECK_S
            flag = _try_db(rt, lambda s: db.runs.cancel_requested(s, run_id), f"run {run_id}: cancel check")
            if flag:
                _stop(rt, run_id, lease, launcher, handle, owned=True, shipped=shipped)
                return "cancelled"
        time.sleep(POLL_S)


def _superseded(rt: Runtime, run_id: int, lease: int, launcher, handle: LaunchHandle, write: str) -> str:
    """The store refused a write under this lease: the run moved on (reaped while this worker could not
    heartbeat, then requeued or failed; claimed again; cancelled). End this attempt's processes and record
    nothing: another claim (or the reaper) owns the run's record now."""
    log.warning(
        "run %d: lease %d is no longer the run's (%s refused: reaped, requeued or claimed again meanwhile): "
        "stopping this attempt only, recording nothing",
        run_id,
        lease,
        write,
    )
    _stop(rt, run_id, lease, launcher, handle, owned=False)
    return "superseded"


def _interrupt(rt: Runtime, run_id: int, lease: int, launcher, handle: LaunchHandle, shipped: LogShipper) -> str:
    """The worker is stopping: end a local run's processes (a Slurm job does not depend on us: it goes on) and
    requeue the run at once (db.runs.requeue_interrupted), so that nobody waits for its lease to run out."""
    slurm = handle.launcher == "slurm"
    if slurm:
        reason = f"its worker stopped; Slurm job {handle.job_id} goes on and the next worker re-attaches to it"
    else:
        launcher.cancel(handle, grace_s=SHUTDOWN_KILL_GRACE_S)  # torchrun's group and every rank
        reason = "its worker was stopped mid-run; the run's processes were ended and the attempt is not counted"
    shipped.ship()

    def requeue(s: Session) -> str:
        if db.runs.requeue_interrupted(s, run_id, rt.worker_name, reason, refund_attempt=not slurm, lease_id=lease):
            return "queued"
        if not slurm and db.runs.cancel_requested(s, run_id) and db.runs.mark_cancelled(s, run_id, lease_id=lease):
            return "cancelled"
        return "interrupted"  # ended meanwhile (cancelled, reaped): its record stands

    # One try, no retry: a stopping worker must not hang on a database that is down (the lease then expires).
    status = _try_db(rt, requeue, f"run {run_id}: requeue on shutdown") or "interrupted"
    log.warning("run %d: worker stopping: %s (%s)", run_id, reason, status)
    return status


class LogShipper:
    """Ships the tail of a run's log.txt into the store (db.runs.store_log) when it grew, best effort while
    the run goes on; the final tail is written before the result, so a finished run's log is there.

    ship() returns False when the store refused it (the run is no longer active under this lease), else True
    (also when nothing was shipped: unchanged, unreadable, database down)."""

    def __init__(self, rt: Runtime, run_id: int, run_dir: str, lease: int | None = None) -> None:
        self.rt, self.run_id, self.run_dir, self.lease, self.shipped_bytes = rt, run_id, run_dir, lease, -1

    def ship(self, final: bool = False) -> bool:
        try:
            tail, size = read_log_tail(self.run_dir, db.runs.LOG_STORE_MAX_BYTES)
        except OSError as exc:  # the shared run dir is unreachable: the run goes on; say so once per call
            log.warning("run %d: log not readable (%s)", self.run_id, exc)
            return True
        if size == self.shipped_bytes and not final:
            return True

        def store(s: Session) -> bool:
            return db.runs.store_log(s, self.run_id, tail, size, final=final, lease_id=self.lease)

        if final:
            stored = with_db(self.rt, store, f"run {self.run_id}: final log", retry_forever=True)
        else:
            tried = _try_db(self.rt, store, f"run {self.run_id}: log")
            if tried is None:
                return True
            stored = tried
        if stored:
            self.shipped_bytes = size
        return stored


def ship_traces(rt: Runtime, run_id: int, run_dir: str | Path, lease: int | None = None) -> int | None:
    """Store each rank's profiler trace (a profiled run's trace.rank{R}.json.gz) once the run ended, before its
    result is recorded, one rank at a time (tens of MB each on a GPU). A trace over the store's limit stays in
    the run directory only, and says so. Returns how many were stored, None when the store refused them (the
    run is no longer active under `lease`)."""
    try:
        files = trace_files(run_dir)
    except OSError as exc:  # the shared run dir is unreachable: the result is still recorded
        log.warning("run %d: traces not readable (%s)", run_id, exc)
        return 0
    stored = 0
    for rank, path in files:
        data = path.read_bytes()

        def store(s: Session, rank: int = rank, data: bytes = data) -> bool:
            return db.runs.store_trace(s, run_id, rank, data, lease_id=lease)

        try:
            if not with_db(rt, store, f"run {run_id}: trace of rank {rank}", retry_forever=True):
                return None
            stored += 1
        except ValueError as exc:
            log.warning("run %d: %s; kept in %s only", run_id, exc, path)
    if stored:
        log.info("run %d: stored %d profiler trace(s)", run_id, stored)
    return stored


def _stop(
    rt: Runtime,
    run_id: int,
    lease: int,
    launcher: Launcher,
    handle: LaunchHandle,
    owned: bool,
    shipped: LogShipper | None = None,
) -> None:
    """End this attempt's processes; owned (a cancel was asked): ship the final log, then record cancelled
    (in that order: the lease fences writes to an active run only)."""
    if not owned and handle.launcher == "slurm":
        # Reaped while this worker could not heartbeat: the reaper requeued it for a worker to re-attach
        # (or cancelled it, and scancelled the job itself). The job does not depend on us: leave it alone.
        log.warning("run %d: no longer ours: stop watching Slurm job %s (left running)", run_id, handle.job_id)
        return
    why = "cancel requested" if owned else f"lease {lease} is no longer the run's (reaped or cancelled)"
    log.info("run %d: %s: ending this attempt's processes", run_id, why)
    launcher.cancel(handle)
    if owned:
        if shipped is not None:
            shipped.ship(final=True)
        with_db(
            rt,
            lambda s: db.runs.mark_cancelled(s, run_id, lease_id=lease),
            f"run {run_id}: mark cancelled",
            retry_forever=True,
        )


_db_warned_at = 0.0


def _try_db(rt: Runtime, fn: Callable[[Session], T], what: str) -> T | None:
    """A best-effort write while the run goes on: the database being down must not stop the run."""
    global _db_warned_at
    try:
        return with_db(rt, fn, what)
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        if time.monotonic() - _db_warned_at > 30:  # once per 30 s of outage, not on every poll
            _db_warned_at = time.monotonic()
            log.warning("%s: database unavailable (%s); the run goes on", what, exc.__class__.__name__)
        return None


def _finish(
    rt: Runtime,
    run_id: int,
    lease: int,
    spec_json: dict,
    attempts: int,
    outcome: LaunchOutcome,
    republish: Callable[[int], None] | None,
) -> str:
    if outcome.result is not None:
        result = outcome.result
        stored = with_db(
            rt,
            lambda s: db.runs.record_result(s, run_id, result, lease_id=lease),
            f"run {run_id}: record result",
            retry_forever=True,
        )
        if not stored:
            log.warning("run %d: %s, not stored: lease %d is no longer the run's", run_id, result.status, lease)
            return "superseded"
        log.info("run %d: %s (recorded)", run_id, result.status)
        return result.status
    assert outcome.error_kind is not None
    if outcome.retryable and attempts <= rt.settings.max_infra_retries:
        requeued = with_db(
            rt,
            lambda s: db.runs.requeue_for_retry(s, run_id, outcome.message or "", lease_id=lease),
            f"run {run_id}: requeue",
            retry_forever=True,
        )
        log.warning(
            "run %d: infrastructure failure on attempt %d (%s): %s",
            run_id,
            attempts,
            outcome.message,
            "requeued" if requeued else f"not requeued (lease {lease} is no longer the run's)",
        )
        if not requeued:
            return "superseded"
        if republish is not None:
            republish(run_id)
        return "queued"
    message = failure_message(outcome)
    if not _record_failure(rt, run_id, lease, spec_json, outcome.error_kind, message, outcome.log_tail):
        return "superseded"
    return "failed"


# torchrun's ChildFailedError summary: one entry per failed rank ("rank : 1 (local_rank: 1)" then "exitcode : -9
# (pid: 123)  (SIGKILL)"), the first failure again under "Root Cause"; and the agent's line per failed local rank.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_SUMMARY_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_AGENT_RE = re.compile(r"failed \(exitcode: (-\d+)\) local_rank: (\d+)")


def killed_ranks(tail: str) -> str | None:
    """The ranks that a signal ended, from torchrun's summary in the log tail ("rank 1 killed by SIGKILL (signal
    9; ...)"), or None. The root cause only when the summary names one: the peers torchrun then stops with SIGTERM
    are not news."""
    _, sep, root = tail.rpartition(_ROOT_CAUSE)
    entries = _SUMMARY_RE.findall(root if sep else tail)
    if entries:
        killed = [(f"rank {rank}", -int(code)) for rank, code in entries if int(code) < 0]
    else:  # the summary cut off: the agent's own line names the local rank
        killed = [(f"local rank {local}", -int(code)) for code, local in _AGENT_RE.findall(tail)]
    if not killed:
        return None
    return "; ".join(_killed_by(who, signum) for who, signum in dict(killed).items())


def _killed_by(who: str, signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    hint = "; a host out-of-memory kill looks like this" if signum == signal.SIGKILL else ""
    return f"{who} killed by {name} (signal {signum}{hint})"


def failure_message(outcome: LaunchOutcome) -> str:
    """The recorded message of a run that left no result: the launcher's, and which rank a signal killed (the
    log tail shows it only as torchrun's "exitcode: -9"; the launcher sees torchrun's own exit code 1)."""
    message = outcome.message or outcome.error_kind or "error"
    note = killed_ranks(outcome.log_tail) if outcome.result is None else None
    return f"{message}: {note}" if note else message


def _record_failure(
    rt: Runtime, run_id: int, lease: int, spec_json: dict[str, Any], kind: ErrorKind, message: str, tail: str
) -> bool:
    """failed(kind) with the message and the log's tail (in the message and in result.error.traceback_tail)."""
    text = f"{message}\n--- log tail ---\n{tail[-TAIL_IN_MESSAGE_CHARS:]}" if tail else message
    try:
        run_key = RunSpec.model_validate(spec_json).run_key()
    except ValueError:
        run_key = "invalid-spec"
    result = RunResult(
        run_key=run_key, status="failed", error=RunError(kind=kind, message=text[:20000], traceback_tail=tail or None)
    )
    stored = with_db(
        rt,
        lambda s: db.runs.record_result(s, run_id, result, lease_id=lease),
        f"run {run_id}: record failure",
        retry_forever=True,
    )
    if not stored:
        log.warning("run %d: failed (%s), not stored: lease %d is no longer the run's", run_id, kind, lease)
        return False
    log.warning("run %d: failed (%s): %s", run_id, kind, message)
    return True
