"""A profiled experiment through the whole service: POST -> a real Celery worker -> real torchrun (gloo, 2
ranks) -> result with its breakdown and each rank's trace shipped into the store -> served over HTTP."""

from __future__ import annotations

import pytest

from tests.worker.conftest import api, cell, start_worker, submit  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def test_profiled_run_ships_traces_and_serves_its_breakdown(cell, api, start_worker) -> None:  # noqa: F811
    start_worker()
    exp_id, (run_id,) = submit(api, cell, gpu_counts=[2], precisions=["fp32"], steps=4, warmup_steps=1, profile_steps=2)
    run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=180)
    assert run.status == "succeeded", f"{run.error_kind}: {run.error_message}"
    assert run.result["breakdown"]["profiled_steps"] == [2, 3]
    for rank in (0, 1):
        trace = api.get(f"/runs/{run_id}/trace", params={"rank": rank})
        assert trace.status_code == 200, trace.text
        names = {e.get("name") for e in trace.json()["traceEvents"]}
        assert {"scalebench.step#2", "scalebench.step#3"} <= names and any(n.startswith("gloo:") for n in names)
    (series,) = api.get(f"/experiments/{exp_id}/breakdown").json()["series"]
    (point,) = series["points"]
    assert (series["precision"], point["num_devices"], point["run_ids"]) == ("fp32", 2, [run_id])
    assert point["communication_ms"] > 0 and 0 < point["exposed_communication_share"] < 1
    assert point == {**point, **{k: v for k, v in run.result["breakdown"]["median"].items()}}
