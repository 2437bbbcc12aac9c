"""Celery tasks: thin adapters over worker.execution (take an id, call one domain function, return).

Registered with `shared_task`, so they bind to whichever app the process made with
`make_celery(include=["worker.tasks"])` (worker/main.py for the `celery` CLI).
"""

from __future__ import annotations

import logging
import os
import threading

import sqlalchemy as sa
from celery import shared_task
from celery.exceptions import WorkerShutdown
from celery.signals import worker_process_init, worker_ready, worker_shutdown, worker_shutting_down

from worker import execution
from worker.queue import TASK_EXECUTE_RUN, dispatch_runs
from worker.reaper import expire_dead_owners, recover_finished_runs
from worker.runtime import get_runtime, reset_runtime

log = logging.getLogger(__name__)
CLAIM_RETRY_BACKOFF_MAX_S = 60


@shared_task(
    name=TASK_EXECUTE_RUN,
    bind=True,
    acks_late=True,
    autoretry_for=(sa.exc.OperationalError, sa.exc.InterfaceError),  # database down at claim time
    retry_backoff=True,
    retry_backoff_max=CLAIM_RETRY_BACKOFF_MAX_S,
    max_retries=None,
)
def execute_run(self, run_id: int) -> str:
    rt = get_runtime()

    def republish(rid: int) -> None:  # an infrastructure retry goes back on its cluster's queue
        execution.with_db(rt, lambda s: dispatch_runs(s, self.app, [rid]), f"run {rid}: republish")

    status = execution.execute_run(rt, int(run_id), republish=republish)
    if execution.shutdown_requested() and threading.current_thread() is threading.main_thread():
        # --pool solo, stopping: the run is recorded (requeued, published again from the outbox), so its
        # message is not acked (Redis restores it on shutdown: a duplicate, which claims nothing twice).
        # Leave Celery's poll loop now: the filesystem transport's loop would poll on for 2 s more.
        raise WorkerShutdown(0)
    return status


@worker_process_init.connect
def _fresh_runtime(**_kwargs) -> None:
    # A forked pool child must not reuse the parent's pooled connections.
    reset_runtime()


@worker_shutting_down.connect
def _interrupt_runs(**_kwargs) -> None:
    """SIGTERM (warm shutdown) or Ctrl-C: do not wait for the runs being watched. A local run's processes are
    ended and the run requeued at once, a Slurm job left running for the next worker (worker.execution).
    Called inside Celery's signal handler (in the main thread): it sets the flag that the watch loops read.
    An idle worker leaves Celery's poll loop at once (WorkerShutdown, Celery's own way out of it; warm
    shutdown follows): with the filesystem transport the loop would otherwise poll on for 2-4 s."""
    execution.request_shutdown()
    if not execution.busy():
        raise WorkerShutdown(0)


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


@worker_shutdown.connect
def _exit_after_shutdown(sender=None, **_kwargs) -> None:
    """Celery's warm shutdown is complete (consumer closed, acks flushed): exit now. The interpreter's own
    teardown of this process took 1.5 s here (measured under strace, on a loaded 2-core machine) and only
    delays `scalebench up`'s stop; the database connections are closed first, logs flushed; no atexit handler
    of ours or Celery's is needed (no --pidfile, no --statedb)."""
    reset_runtime()
    logging.shutdown()
    os._exit(getattr(sender, "exitcode", 0) or 0)
