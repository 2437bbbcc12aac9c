"""The reaper: no run is ever left `running` without a live worker.

One pass (`reap_once`):
0. end the leases of runs whose worker is known dead (its pid is gone on this host, e.g. a worker SIGKILLed
   under `scalebench up`), so that steps 2-3 take them now instead of when the lease runs out;
1. recover finished run dirs: an active run whose worker is gone (lease expired, or a dead pid on this host)
   but whose result.json is on disk is recorded from it (e.g. the database was down when it finished);
2. expired leases of runs with a submitted Slurm job (handle.json in the run dir, else a job found by its name
   scalebench-<run id>: its worker died between sbatch and writing handle.json): the job does not depend on
   the worker that died, so the run goes back to the queue without spending an attempt and is neither
   failed nor scancelled; the next worker to claim it re-attaches to the job (worker.execution);
3. reap the other expired leases (db.runs.reap_expired): back to queued while attempts remain, else failed
   `worker_lost`; processes of reaped runs still alive on this host are ended (extra safety: PDEATHSIG
   normally took them down with their worker), a reaped run's Slurm job only when a cancel was pending;
Requeued runs have dispatched_at NULL: the scheduler's dispatcher pass (worker.queue.dispatch_pending)
publishes them again. The scheduler process (worker.scheduler) runs this pass every few seconds.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

import db.runs
from core.contracts.specs import RunResult
from db.base import utcnow
from db.models import Run
from osutil import procs
from worker.execution import find_slurm_job, ship_traces, with_db
from worker.launchers.base import SPEC_FILE, LaunchHandle, read_log_tail, read_result
from worker.runtime import Runtime

log = logging.getLogger(__name__)


def _owner_is_dead(run: Run, host: str, now: datetime) -> bool:
    if run.lease_expires_at is not None and run.lease_expires_at < now:
        return True
    if run.host == host and run.worker and ":" in run.worker:
        pid = run.worker.rsplit(":", 1)[1]
        return pid.isdigit() and not procs.is_alive(int(pid))
    return False


def _worker_is_dead(worker: str) -> bool:
    """A worker named host:pid (worker.runtime) of this host whose pid no longer runs."""
    pid = worker.rsplit(":", 1)[-1]
    return pid.isdigit() and not procs.is_alive(int(pid))


def expire_dead_owners(rt: Runtime) -> list[int]:
    """End the leases of active runs whose worker ran on this host and is gone (db.runs.expire_leases)."""
    owned = with_db(rt, lambda s: db.runs.active_runs_on_host(s, rt.host), "reap: runs of this host")
    dead = [(run_id, worker) for run_id, worker in owned if _worker_is_dead(worker)]
    if not dead:
        return []
    expired = with_db(rt, lambda s: db.runs.expire_leases(s, dead), "reap: leases of dead workers")
    if expired:
        log.warning(
            "runs whose worker is gone from this host (%s): lease ended now: %s",
            ", ".join(sorted({w for _, w in dead})),
            expired,
        )
    return expired


def _processes_alive(run_dir: Path) -> bool:
    return bool(procs.pids_with_arg(str(run_dir / SPEC_FILE)))


def recover_finished_runs(rt: Runtime) -> list[int]:
    """Record active runs whose worker is gone but whose result.json is on disk. Returns their ids."""
    now = utcnow()

    recovered = []
    for run in with_db(rt, db.runs.active_runs_with_dir, "recover: list active runs"):
        run_dir = Path(run.run_dir or "")
        if not run_dir.is_dir() or not _owner_is_dead(run, rt.host, now) or _processes_alive(run_dir):
            continue
        result, _why = read_result(run_dir)
        if result is None:
            continue
        tail, size = read_log_tail(run_dir, db.runs.LOG_STORE_MAX_BYTES)
        lease = run.lease_id  # recorded under the lease it was read with: a run claimed again meanwhile is not
        if ship_traces(rt, run.id, run_dir, lease) is None:
            continue

        def record(
            s: Session, r: RunResult = result, i: int = run.id, t: bytes = tail, n: int = size, k: int = lease
        ) -> bool:
            return db.runs.store_log(s, i, t, n, final=True, lease_id=k) and db.runs.record_result(s, i, r, lease_id=k)

        if with_db(rt, record, f"recover run {run.id}"):
            log.warning("run %d: recorded from %s (its worker was gone)", run.id, run_dir / "result.json")
            recovered.append(run.id)
    return recovered


def requeue_detached_runs(rt: Runtime, now: datetime | None = None) -> list[int]:
    """Expired runs that have a Slurm job to re-attach to -> queued (db.runs.requeue_detached). Returns their ids."""
    now = now or utcnow()
    run_ids = []
    expired = with_db(rt, lambda s: db.runs.expired_active_runs(s, now), "reap: expired runs")
    for run_id, cluster_name, run_dir, created_at, attempts, lease_id in expired:
        cluster = rt.clusters.get(cluster_name)
        if cluster is None or cluster.launcher != "slurm":
            continue
        try:
            run_dir = run_dir or rt.run_dir(cluster, run_id, lease_id)
            handle = find_slurm_job(rt, cluster, run_id, run_dir, created_at, attempts)
        except RuntimeError as exc:  # Slurm cannot be asked from here: the lease is reaped as usual, and the
            # next worker's claim still looks the job up by its name before it would submit one
            log.warning("run %d: could not ask Slurm for its job (%s)", run_id, exc)
            continue
        if handle is not None:
            run_ids.append(run_id)
    if not run_ids:
        return []
    return with_db(rt, lambda s: db.runs.requeue_detached(s, run_ids, now), "reap: requeue detached runs")


def _end_leftovers(rt: Runtime, run_dirs: dict[int, str | None]) -> None:
    """Processes of reaped runs still alive on this host are ended (the run was given up or requeued): those
    of the reaped attempt's directory only (read in the reaping UPDATE), never a retry's claimed since."""
    for run_id, run_dir in run_dirs.items():
        if not run_dir or not Path(run_dir).is_dir():
            continue
        handle = LaunchHandle.load(run_dir)
        if handle is not None and handle.launcher == "slurm" and handle.job_id:
            _cancel_slurm_job(rt, run_id, handle)  # not a child of any worker: PDEATHSIG does not reach it
            continue
        pgid = None
        if handle and handle.pid and procs.is_alive(handle.pid, handle.extra.get("start_ticks")):
            pgid = handle.extra.get("pgid", handle.pid)
        if pgid is not None or _processes_alive(Path(run_dir)):
            log.warning("run %d: reaped but its processes are alive here: ending them", run_id)
            procs.terminate_run_processes(pgid, str(Path(run_dir) / SPEC_FILE), grace_s=5.0)


def _cancel_slurm_job(rt: Runtime, run_id: int, handle: LaunchHandle) -> None:
    cluster = rt.clusters.get(handle.extra.get("cluster", ""))
    if cluster is None or cluster.launcher != "slurm":
        log.warning("run %d: reaped; Slurm job %s of an unknown cluster left alone", run_id, handle.job_id)
        return
    try:
        rt.launcher(cluster).cancel(handle)
        log.warning("run %d: reaped: cancelled its Slurm job %s", run_id, handle.job_id)
    except Exception:  # noqa: BLE001 - scancel missing or refused: logged; Slurm's --time still bounds the job
        log.exception("run %d: reaped; could not cancel Slurm job %s", run_id, handle.job_id)


def reap_once(rt: Runtime) -> dict[str, list[int]]:
    """One pass: end leases of dead workers, recover finished run dirs, requeue runs with a Slurm job to
    re-attach, reap expired leases."""
    expire_dead_owners(rt)
    recovered = recover_finished_runs(rt)
    detached = requeue_detached_runs(rt)
    max_attempts = rt.settings.max_infra_retries + 1
    reaped = with_db(rt, lambda s: db.runs.reap_expired_runs(s, max_attempts=max_attempts), "reap leases")
    _end_leftovers(rt, reaped.run_dirs)
    return {"recovered": recovered, "reattach": detached, "requeued": reaped.requeued, "failed": reaped.failed}
