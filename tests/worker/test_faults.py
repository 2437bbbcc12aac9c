"""Faults, each for real: worker SIGKILLed mid-run, cancel, infrastructure retries, Redis restart, Postgres
down when a run finishes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from db.runs import get_log
from tests.worker.conftest import LONG, TINY, run_reaper_once, submit, wait_until
from tests.worker.tcp_proxy import TcpProxy
from worker.launchers.base import LaunchHandle

pytestmark = pytest.mark.slow


def test_worker_sigkill_ends_torchrun_and_reaper_requeues_then_fails(cell, api, start_worker, queued_messages) -> None:
    _, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [2]}))
    for attempt in (1, 2):
        worker = start_worker()
        cell.wait_steps(run_id, attempt=attempt)
        assert len(cell.run_pids(run_id)) == 3  # torchrun + 2 ranks
        os.kill(worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        # PDEATHSIG: torchrun gets SIGTERM when the worker dies and takes its ranks down: no orphans.
        wait_until(lambda: not cell.run_pids(run_id), 20, "torchrun and its ranks to end with the worker")
        died_s = time.monotonic() - t0
        run = cell.run(run_id)
        assert run.status == "running" and run.attempts == attempt  # nobody recorded anything yet
        wait_until(lambda: cell.run(run_id).lease_expires_at.timestamp() < time.time(), 10, "the lease to expire")
        run_reaper_once(cell)
        run = cell.run(run_id)
        if attempt == 1:  # attempts left (max_infra_retries=1): requeued and published again
            assert run.status == "queued" and run.dispatched_at is not None, (run.status, run.error_message)
            assert [args for _task, args in queued_messages(cell.name)] == [[run_id]]
        else:
            assert run.status == "failed" and run.error_kind == "worker_lost"
            assert run.finished_at is not None
        assert died_s < 15


def test_cancel_ends_the_torchrun_group_within_10s(cell, api, start_worker) -> None:
    start_worker()
    exp_id, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [2]}))
    cell.wait_steps(run_id)
    t0 = time.monotonic()
    response = api.post(f"/experiments/{exp_id}/cancel")
    assert response.status_code == 200 and response.json()["num_cancel_requested"] == 1
    cell.wait_status(run_id, ("cancelled",), timeout_s=10)
    wait_until(lambda: not cell.run_pids(run_id), 10 - (time.monotonic() - t0), "the run's processes to end")
    assert time.monotonic() - t0 < 10
    run = cell.run(run_id)
    assert run.error_kind == "cancelled" and run.finished_at is not None
    with cell.session_factory() as s:  # shipped before the run was recorded cancelled (the lease fences after)
        stored = get_log(s, run_id)
        assert stored is not None and stored.final and "step" in stored.text


def test_infrastructure_failure_is_retried_a_bounded_number_of_times(cell, api, start_worker) -> None:
    """torchrun killed from outside (OOM killer, operator): retryable; max_infra_retries=1 -> 2 attempts."""
    worker = start_worker()
    _, (run_id,) = submit(api, cell, **(LONG | {"gpu_counts": [1]}))
    for attempt in (1, 2):
        cell.wait_steps(run_id, attempt=attempt)
        handle = LaunchHandle.load(cell.run_dir(run_id))
        os.kill(handle.pid, signal.SIGKILL)
    run = cell.wait_status(run_id, ("failed",), timeout_s=60)
    assert run.error_kind == "infrastructure" and run.attempts == 2
    assert "killed by SIGKILL" in run.error_message
    assert worker.log().count("infrastructure failure on attempt 1") == 1
    wait_until(lambda: not cell.run_pids(run_id), 15, "orphaned ranks to be swept")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_server(port: int, data_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(
        lambda: (
            subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip()
            == "PONG"
        ),
        10,
        "redis-server",
    )
    return proc


@pytest.mark.skipif(
    not any((Path(p) / "redis-server").exists() for p in os.environ["PATH"].split(":")),
    reason="redis-server is not installed (apt-get install redis-server)",
)
def test_redis_restart_while_runs_are_queued_loses_nothing(cell, make_client, start_worker) -> None:
    """Redis with an append-only file (as in docker-compose.yml): queued messages survive a restart."""
    port, data_dir = _free_port(), cell.tmp / "redis"
    data_dir.mkdir()
    redis_proc = _redis_server(port, data_dir)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        settings = cell.settings.__class__(**{**cell.settings.__dict__, "broker_url": url})
        api = make_client(settings=settings)
        _, run_ids = submit(api, cell, gpu_counts=[1, 2])  # published; no worker yet
        redis_proc.send_signal(signal.SIGTERM)  # shutdown: the AOF is on disk
        redis_proc.wait(10)
        redis_proc = _redis_server(port, data_dir)
        start_worker(env_extra={"SCALEBENCH_BROKER_URL": url})
        for run_id in run_ids:
            assert cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=150).status == "succeeded"
    finally:
        redis_proc.kill()
        redis_proc.wait()


def test_postgres_down_when_the_run_finishes_result_recorded_when_back(cell, api, start_worker, pg_url) -> None:
    """The worker reaches Postgres through a proxy the test closes mid-run and reopens after the run ended."""
    from sqlalchemy.engine import make_url

    target = make_url(pg_url)
    proxy = TcpProxy(target.host or "127.0.0.1", target.port or 5432)
    proxy.start()
    try:
        worker_db = target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        worker = start_worker(env_extra={"SCALEBENCH_DATABASE_URL": worker_db})
        steps = 150
        _, (run_id,) = submit(api, cell, **(TINY | {"steps": steps, "gpu_counts": [1]}))
        cell.wait_steps(run_id)
        proxy.close()  # refuse new connections, cut the open ones
        result_json = cell.run_dir(run_id) / "result.json"
        wait_until(result_json.is_file, 120, "the run to finish and write result.json")
        time.sleep(3)  # the worker tries to record, fails, backs off
        assert cell.run(run_id).status == "running"
        assert result_json.is_file() and "database unavailable" in worker.log()
        proxy.reopen()
        run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=30)
        assert run.status == "succeeded" and run.attempts == 1
        with cell.session_factory() as s:
            from db.runs import get_steps

            assert len(get_steps(s, run_id)) == steps
    finally:
        proxy.stop()


def test_worker_sigterm_mid_run_requeues_the_run_at_once_and_the_next_worker_finishes_it(cell, api, start_worker):
    """A stopping worker does not wait for its run: its processes end, the run is requeued with the attempt
    given back (recorded at once, no lease to wait for), and the worker is gone within seconds."""
    worker = start_worker()
    _, (run_id,) = submit(api, cell, **(TINY | {"steps": 150, "gpu_counts": [1]}))
    cell.wait_steps(run_id)
    assert len(cell.run_pids(run_id)) == 2  # torchrun + its rank
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(10) == 0, worker.log()[-3000:]
    stop_s = time.monotonic() - t0
    assert stop_s < 5 and not cell.run_pids(run_id), (stop_s, cell.run_pids(run_id))
    run = cell.run(run_id)
    assert (run.status, run.attempts, run.dispatched_at, run.worker) == ("queued", 0, None, None)
    assert run.error_message.startswith("requeued: its worker was stopped mid-run"), run.error_message
    print(f"worker SIGTERM mid-run: exited in {stop_s:.2f} s")
    start_worker()
    run_reaper_once(cell)  # the scheduler's dispatcher publishes the requeued run
    run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=300)
    assert run.status == "succeeded" and run.attempts == 1, run.error_message
