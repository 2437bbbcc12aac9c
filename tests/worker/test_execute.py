"""Submit over HTTP -> a real Celery worker -> real torchrun on CPU -> result and step metrics in Postgres."""

from __future__ import annotations

import os
import signal

import pytest
import sqlalchemy as sa

from db.models import Run, RunSummary, StepMetric
from tests.worker.conftest import LONG, TINY, submit, wait_until
from worker.launchers.base import LaunchHandle
from worker.queue import publish_run

pytestmark = pytest.mark.slow


def test_submitted_runs_execute_and_store_results(cell, api, start_worker, celery_app) -> None:
    worker = start_worker()
    exp_id, run_ids = submit(api, cell, gpu_counts=[1, 2], precisions=["fp8-tensorwise"])
    for run_id in run_ids:
        run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=150)
        assert run.status == "succeeded", f"{run.error_kind}: {run.error_message}"
        assert run.attempts == 1 and run.started_at <= run.finished_at
        assert run.result["environment"]["world_size"] == run.num_devices
    with cell.session_factory() as s:
        steps = s.scalars(sa.select(StepMetric).where(StepMetric.run_id == run_ids[1]).order_by(StepMetric.step)).all()
        summary = s.get(RunSummary, run_ids[1])
    assert [st.step for st in steps] == list(range(1, TINY["steps"] + 1)) or len(steps) == TINY["steps"]
    assert all(st.loss is not None and st.loss > 0 for st in steps)
    assert summary is not None and summary.tokens_per_sec > 0 and summary.num_float8_linears

    # Over HTTP: the experiment ended, the run shows its summary, its log is served.
    assert api.get(f"/experiments/{exp_id}").json()["status"] == "succeeded"
    detail = api.get(f"/runs/{run_ids[0]}").json()
    assert detail["summary"]["tokens_per_sec"] > 0
    log = api.get(f"/runs/{run_ids[0]}/log")
    assert log.status_code == 200 and "step 3/3" in log.text

    # A duplicate (or redelivered) message for a finished run does nothing.
    publish_run(celery_app, run_ids[0], cell.name)
    wait_until(lambda: worker.log().count("not claimable") >= 1, 30, "the worker to skip the duplicate")
    run = cell.run(run_ids[0])
    assert run.status == "succeeded" and run.attempts == 1

    metrics = api.get("/metrics").text
    assert f'scalebench_runs{{cluster="{cell.name}",status="succeeded"}} 2.0' in metrics
    assert f'scalebench_run_duration_seconds_count{{cluster="{cell.name}",status="succeeded"}} 2.0' in metrics

    # A pipelined layout runs through the same path: two stages of one block each, 2 one-sequence micro-batches.
    _, (pp_run,) = submit(api, cell, gpu_counts=[2], layouts=["pp=2+fsdp"], num_layers=2, local_batch_size=2)
    run = cell.wait_status(pp_run, ("succeeded", "failed"), timeout_s=150)
    assert run.status == "succeeded", f"{run.error_kind}: {run.error_message}"
    with cell.session_factory() as s:
        losses = s.scalars(sa.select(StepMetric.loss).where(StepMetric.run_id == pp_run)).all()
    assert len(losses) == TINY["steps"] and all(x is not None and x > 0 for x in losses)  # the last stage's, reduced


@pytest.mark.parametrize("fault, kind", [("error:1:0", "error"), ("oom:1:1", "oom")])
def test_runner_failure_is_recorded_with_its_kind_and_log_tail(cell, api, start_worker, fault: str, kind: str) -> None:
    # SCALEBENCH_FAULT is the runner's test hook: one rank fails after a step, for real, under torchrun.
    start_worker(env_extra={"SCALEBENCH_FAULT": fault})
    _, (run_id,) = submit(api, cell, gpu_counts=[2], steps=4)
    run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=150)
    assert run.status == "failed" and run.error_kind == kind, run.error_message
    assert run.attempts == 1  # a runner failure is not retried
    assert run.result["error"]["kind"] == kind
    assert not cell.run_pids(run_id)


def test_crash_without_result_fails_as_error_with_log_tail(cell, api, start_worker) -> None:
    """A rank killed outright: torchrun exits non-zero, no result.json -> failed 'error' with torchrun's log."""
    start_worker()
    _, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [2]}))
    cell.wait_steps(run_id)
    handle = LaunchHandle.load(cell.run_dir(run_id))
    assert handle is not None
    ranks = [p for p in cell.run_pids(run_id) if p != handle.pid]
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    run = cell.wait_status(run_id, ("failed",), timeout_s=60)
    assert run.error_kind == "error"
    assert "torchrun exited with code" in run.error_message and "--- log tail ---" in run.error_message
    assert run.result["error"]["traceback_tail"]
    wait_until(lambda: not cell.run_pids(run_id), 15, "the surviving rank to end")
    assert run.attempts == 1


def test_queued_run_of_a_cluster_without_worker_stays_queued(cell, api) -> None:
    """No worker on the queue: the run waits (queued and dispatched), it is not lost or failed."""
    _, (run_id,) = submit(api, cell)
    run = cell.run(run_id)
    assert run.status == "queued" and run.dispatched_at is not None
    with cell.session_factory() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Run).where(Run.status == "running")) == 0
