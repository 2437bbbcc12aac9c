"""Celery tasks: thin adapters over worker.execution (take an id, call one domain function, return).

Registered with `shared_task`, so they bind to whichever app the process made with
`make_celery(include=["worker.tasks"])` (worker/main.py for the `celery` CLI).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from celery import shared_task
from celery.signals import worker_process_init, worker_ready, worker_shutting_down

from worker import execution
from worker.queue import TASK_EXECUTE_RUN, dispatch_runs
from worker.reaper import expire_dead_owners, recover_finished_runs
from worker.runtime import get_runtime, reset_runtime

log = logging.getLogger(__name__)
CLAIM_RETRY_BACKOFF_MAX_S = 60


@shared_task(name=TASK_EXECUTE_RUN, bind=True, acks_late=True,
             autoretry_for=(sa.exc.OperationalError, sa.exc.InterfaceError),  # database down at claim time
             retry_backoff=True, retry_backoff_max=CLAIM_RETRY_BACKOFF_MAX_S, max_retries=None)
def execute_run(self, run_id: int) -> str:
    rt = get_runtime()

    def republish(rid: int) -> None:  # an infrastructure retry goes back on its cluster's queue
        execution.with_db(rt, lambda s: dispatch_runs(s, self.app, [rid]), f"run {rid}: republish")

    return execution.execute_run(rt, int(run_id), republish=republish)


@worker_process_init.connect
def _fresh_runtime(**_kwargs) -> None:
    # A forked pool child must not reuse the parent's pooled connections.
    reset_runtime()


@worker_shutting_down.connect
def _interrupt_runs(**_kwargs) -> None:
    """SIGTERM (warm shutdown) or Ctrl-C: do not wait for the runs being watched. A local run's processes are
    ended and the run requeued at once, a Slurm job left running for the next worker (worker.execution).
    Called inside Celery's signal handler: it only sets a flag that the watch loops read (and log)."""
    execution.request_shutdown()


@worker_ready.connect
def _recover_on_start(**_kwargs) -> None:
    """A restarted worker first ends the leases of runs whose worker died on this host (the scheduler then
    requeues them at once) and records runs that finished while it (or the database) was down."""
    try:
        expire_dead_owners(get_runtime())
        recovered = recover_finished_runs(get_runtime())
        if recovered:
            log.warning("recovered finished runs on start: %s", recovered)
    except sa.exc.OperationalError as exc:
        log.warning("recover on start: database unavailable (%s); the reaper will retry", exc.__class__.__name__)
