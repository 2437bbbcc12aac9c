"""Fencing, for real: a Celery worker paused past its lease (SIGSTOP) whose run was reaped, requeued and run
again must not record anything about it, nor touch the retry's processes, once it resumes (SIGCONT).

Real processes throughout: `celery worker` subprocesses, torchrun and its ranks on CPU, the scheduler's reaper
as its own process (`python -m worker.scheduler --once`), Redis, and PostgreSQL (and SQLite for the one-worker
case).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from db.runs import get_log
from tests.worker.conftest import LEASE_S, LONG, run_reaper_once, submit, wait_until

pytestmark = pytest.mark.slow
REFUSED = "lease 1 is no longer the run's"


def _pause_until_requeued(cell, worker, run_id: int) -> None:
    """SIGSTOP the worker mid-run, let its lease expire and run one reaper pass: the run is requeued (attempts
    left), published again, and attempt 1's processes are ended by the reaper."""
    os.kill(worker.pid, signal.SIGSTOP)
    wait_until(lambda: cell.run(run_id).lease_expires_at.timestamp() < time.time(), LEASE_S + 10, "the lease to expire")
    run_reaper_once(cell)
    run = cell.run(run_id)
    # requeued and published again (a second worker may have claimed it already: lease 2)
    requeued = run.status == "queued" and run.dispatched_at is not None
    assert requeued or (run.status == "running" and run.lease_id == 2), (run.status, run.error_message)
    wait_until(lambda: not cell.run_pids(run_id, attempt=1), 20, "the reaper to end attempt 1's processes")


@pytest.mark.parametrize("cell", ["postgres", "sqlite"], indirect=True)
def test_a_paused_worker_resumed_after_the_reaper_requeued_its_run_records_nothing(cell, api, start_worker) -> None:
    worker = start_worker()
    _, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [1]}))  # one rank: a third of two ranks' CPU time
    cell.wait_steps(run_id)
    try:
        _pause_until_requeued(cell, worker, run_id)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    # Resumed, it finds attempt 1's torchrun gone: its final log is refused, it records nothing (the run stays
    # queued, not failed), then takes the message the dispatcher published again and runs attempt 2.
    wait_until(lambda: REFUSED in worker.log(), 30, "the resumed worker to see its lease refused")
    run = cell.run(run_id)
    assert run.status in ("queued", "running") and run.error_kind is None, (run.status, run.error_message)
    run = cell.wait_status(run_id, ("succeeded", "failed", "cancelled"), timeout_s=1200)
    assert run.status == "succeeded", run.error_message
    assert (run.attempts, run.lease_id) == (2, 2)
    assert run.run_dir == str(cell.run_dir(run_id, attempt=2)) and cell.run_dir(run_id, attempt=1) != cell.run_dir(
        run_id, attempt=2
    )
    assert "torchrun exited" not in (run.error_message or "")
    with cell.session_factory() as s:
        assert get_log(s, run_id).final and "step 1000/1000" in get_log(s, run_id).text


def test_two_workers_the_resumed_one_leaves_the_retry_on_the_other_alone(cell, api, start_worker) -> None:
    """PostgreSQL + Redis, two workers: the retry runs on the second while the first resumes."""
    first = start_worker()
    _, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [1]}))
    cell.wait_steps(run_id)
    second = start_worker()
    try:
        _pause_until_requeued(cell, first, run_id)
        cell.wait_steps(run_id, attempt=2)  # the retry, on the second worker (the first is stopped)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    retry_pids = cell.run_pids(run_id, attempt=2)
    assert len(retry_pids) == 2, retry_pids  # torchrun + its rank
    wait_until(lambda: REFUSED in first.log(), 30, "the resumed worker to see its lease refused")
    time.sleep(2)  # whatever the first worker sweeps, it has swept by now
    assert set(retry_pids) <= set(cell.run_pids(run_id, attempt=2)), "the stale worker ended the retry's processes"
    run = cell.run(run_id)
    assert run.status == "running" and run.lease_id == 2 and run.worker.endswith(f":{second.pid}"), run.worker
    run = cell.wait_status(run_id, ("succeeded", "failed", "cancelled"), timeout_s=1200)
    assert run.status == "succeeded", run.error_message
    assert "ranks remain" not in first.log()
