"""Fast (no torchrun): recording finished run dirs whose worker is gone, reaping, and GET /metrics."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

import db.runs
from core.contracts.clusters import load_clusters
from db.base import utcnow
from db.models import Run
from db.session import session_scope
from tests.db.helpers import add_experiment, succeeded_result
from worker.launchers.base import RESULT_FILE, write_json_atomic
from worker.reaper import reap_once, recover_finished_runs
from worker.runtime import Runtime


def _runtime(test_settings, pg_engine, pg_session_factory) -> Runtime:
    return Runtime(
        settings=test_settings,
        clusters=load_clusters(None),
        engine=pg_engine,
        session_factory=pg_session_factory,
        pid=os.getpid(),
    )


def _claim(sf, run_id: int, worker: str, run_dir: str) -> None:
    with session_scope(sf) as s:
        assert db.runs.claim_run(s, run_id, worker, socket.gethostname(), lease_s=60)
        db.runs.update_launch(s, run_id, run_dir=run_dir)


def test_recover_records_a_finished_run_dir_of_a_dead_worker(
    test_settings, pg_engine, pg_session_factory, tmp_path
) -> None:
    rt = _runtime(test_settings, pg_engine, pg_session_factory)
    with pg_session_factory() as s:
        _, (dead_id, alive_id, *_rest) = add_experiment(s)
    for run_id, pid in ((dead_id, 2**22 + 12345), (alive_id, os.getpid())):  # a pid that cannot exist / ours
        run_dir = tmp_path / f"run-{run_id}"
        run_dir.mkdir()
        write_json_atomic(run_dir / RESULT_FILE, succeeded_result(num_steps=5).model_dump(mode="json"))
        _claim(pg_session_factory, run_id, f"{socket.gethostname()}:{pid}", str(run_dir))

    assert recover_finished_runs(rt) == [dead_id]  # the live worker records its own run
    with pg_session_factory() as s:
        assert s.get(Run, dead_id).status == "succeeded"
        assert len(db.runs.get_steps(s, dead_id)) == 5
        assert s.get(Run, alive_id).status == "running"


def test_reaper_requeues_expired_leases_then_fails_them_as_worker_lost(
    test_settings, pg_engine, pg_session_factory
) -> None:
    rt = _runtime(test_settings, pg_engine, pg_session_factory)  # max_infra_retries 2 -> 3 attempts
    with pg_session_factory() as s:
        _, (run_id, *_rest) = add_experiment(s)
    for attempt in (1, 2, 3):
        with session_scope(pg_session_factory) as s:
            assert db.runs.claim_run(
                s, run_id, "elsewhere:1", "elsewhere", lease_s=60, now=utcnow() - timedelta(seconds=120)
            )  # lease expired a minute ago
        out = reap_once(rt)  # no Celery app: nothing published
        expected = {"requeued": [run_id], "failed": []} if attempt < 3 else {"requeued": [], "failed": [run_id]}
        assert {k: out[k] for k in ("requeued", "failed")} == expected
    with pg_session_factory() as s:
        run = s.get(Run, run_id)
        assert (run.status, run.error_kind, run.attempts) == ("failed", "worker_lost", 3)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (smp.name, tuple(sorted(smp.labels.items()))): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }


def test_metrics_count_runs_by_status_queue_depth_and_durations(client, pg_session_factory) -> None:
    with pg_session_factory() as s:
        _, run_ids = add_experiment(s)  # 6 runs on local-cpu, queued and undispatched
    now = utcnow()
    with session_scope(pg_session_factory) as s:
        s.execute(sa.update(Run).where(Run.id == run_ids[0]).values(dispatched_at=now))
        s.execute(
            sa.update(Run)
            .where(Run.id == run_ids[1])
            .values(status="succeeded", dispatched_at=now, started_at=now, finished_at=now + timedelta(seconds=45))
        )
        s.execute(
            sa.update(Run)
            .where(Run.id == run_ids[2])
            .values(status="failed", error_kind="oom", started_at=now, finished_at=now + timedelta(seconds=5))
        )
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    m = _samples(response.text)
    runs = lambda status: m[("scalebench_runs", (("cluster", "local-cpu"), ("status", status)))]  # noqa: E731
    assert (runs("queued"), runs("succeeded"), runs("failed"), runs("running")) == (4, 1, 1, 0)
    depth = lambda state: m[("scalebench_queue_depth", (("cluster", "local-cpu"), ("state", state)))]  # noqa: E731
    assert (depth("undispatched"), depth("dispatched")) == (3, 1)
    ok = (("cluster", "local-cpu"), ("status", "succeeded"))
    assert m[("scalebench_run_duration_seconds_count", ok)] == 1
    assert abs(m[("scalebench_run_duration_seconds_sum", ok)] - 45) < 0.01
    assert (
        m[
            (
                "scalebench_run_duration_seconds_bucket",
                (("cluster", "local-cpu"), ("le", "30.0"), ("status", "succeeded")),
            )
        ]
        == 0
    )
    assert (
        m[
            (
                "scalebench_run_duration_seconds_bucket",
                (("cluster", "local-cpu"), ("le", "60.0"), ("status", "succeeded")),
            )
        ]
        == 1
    )
    assert m[("scalebench_dispatch_latency_seconds_count", (("cluster", "local-cpu"),))] == 2
    assert m[("scalebench_oldest_queued_run_age_seconds", (("cluster", "local-cpu"),))] >= 0
