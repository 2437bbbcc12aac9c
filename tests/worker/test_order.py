"""Runs of one cluster start in submission order whatever order the broker delivers their messages in: a
message starts the oldest claimable run of its cluster (db.runs.claim_candidates)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from db import outbox
from db.session import session_scope
from tests.worker.conftest import TINY
from worker.queue import make_celery, publish_run

pytestmark = pytest.mark.slow
DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1: the API stores the runs without publishing


def test_runs_start_in_submission_order_on_the_filesystem_broker(cell, make_client, start_worker) -> None:
    down = make_client(settings=replace(cell.settings, broker_url=DOWN))
    body = {"name": "order", "cluster": cell.name, "precisions": ["fp32"], "gpu_counts": [1]} | TINY | {"repeats": 3}
    response = down.post("/experiments", json=body)
    assert response.status_code == 201 and not response.json()["dispatched"], response.text
    run_ids = [r["id"] for r in response.json()["runs"]]
    assert len(run_ids) == 3

    # The filesystem transport delivers by file name (publish time in ms, then a random uuid): publishing
    # newest first, 5 ms apart, makes it deliver newest first, as it may do within one millisecond.
    fs_url = f"filesystem://{cell.tmp / 'broker'}"
    app = make_celery(replace(cell.settings, broker_url=fs_url))
    for run_id in reversed(run_ids):
        publish_run(app, run_id, cell.name)
        time.sleep(0.005)
    with session_scope(cell.session_factory) as s:
        outbox.stamp_dispatched(s, run_ids)
    worker = start_worker(env_extra={"SCALEBENCH_BROKER_URL": fs_url})

    runs = [cell.wait_status(i, ("succeeded", "failed"), timeout_s=180) for i in run_ids]
    assert [r.status for r in runs] == ["succeeded"] * 3, [r.error_message for r in runs]
    started = [r.started_at for r in runs]
    assert started == sorted(started), started
    assert all(r.attempts == 1 for r in runs)
    # Delivered newest first: the newest run's message started the oldest run, the oldest run's the newest.
    log = worker.log()
    assert f"message for run {run_ids[-1]}: starting run {run_ids[0]}" in log, log[-3000:]
    assert f"message for run {run_ids[0]}: starting run {run_ids[-1]}" in log, log[-3000:]
