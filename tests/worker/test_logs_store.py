"""Run logs travel through the store: the API reads them from the database, never from a run directory.

The API here has a data directory of its own that the worker does not share (as the compose api service has
no runs volume, and as a Slurm cluster keeps run directories on the cluster). A real worker runs torchrun
on CPU; the live tail and the final log are read over HTTP.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.worker.conftest import submit, wait_until

pytestmark = pytest.mark.slow


def test_live_and_final_log_through_the_api_without_a_shared_disk(cell, make_client, start_worker, tmp_path_factory):
    api_dir = tmp_path_factory.mktemp("api-data")
    api = make_client(settings=replace(cell.settings, data_dir=api_dir, runs_dir=api_dir / "runs"))
    start_worker()
    steps = 200  # logs every 20 steps; long enough to be read while running
    _, [run_id] = submit(api, cell, gpu_counts=[2], steps=steps)

    def live():  # a tail shipped while the run goes on
        r = api.get(f"/runs/{run_id}/log")
        return r.status_code == 200 and "step 20/" in r.text and cell.run(run_id).status == "running" and r

    live_response = wait_until(live, 150, f"run {run_id}'s live log over HTTP", interval_s=0.5)
    assert live_response.headers["X-Log-Final"] == "false"
    assert f"step {steps}/{steps}" not in live_response.text

    run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=300)
    assert run.status == "succeeded", f"{run.error_kind}: {run.error_message}"
    final = api.get(f"/runs/{run_id}/log", params={"tail_bytes": 1 << 20})
    assert final.status_code == 200 and final.headers["X-Log-Final"] == "true"
    on_worker_disk = (cell.run_dir(run_id) / "log.txt").read_text(errors="replace")
    assert f"step {steps}/{steps}" in final.text and final.text == on_worker_disk
    assert int(final.headers["X-Log-Bytes"]) == len(on_worker_disk.encode())
    assert not (api_dir / "runs").exists()  # nothing was read from (or written to) the API's own disk
    assert not str(cell.run_dir(run_id)).startswith(str(api_dir))
