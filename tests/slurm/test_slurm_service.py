"""The Slurm path of the service end to end, on the real one-node Slurm: API (TestClient) -> Redis -> a real
`celery worker --pool threads --concurrency 4` (as docs/slurm.md tells a Slurm cluster's worker to run) ->
sbatch -> `srun torchrun` -> the runner -> result.json -> Postgres.

Shown here: runs of 2 and 4 CPU ranks over 2 Slurm tasks recorded, both waiting in Slurm's queue at once as
`pending` with their job ids; cancel through the API -> scancel -> cancelled; a worker SIGKILLed while its job
runs, the reaper requeues the run without failing it or cancelling the job, a new worker re-attaches and
records the result, with exactly one sbatch for the run.

Not here: a job killed at its Slurm time limit. It takes 60-95 s on this Slurm (limits are whole minutes,
checked every ~30 s), so it is covered at the launcher level (test_slurm_jobs.py::test_time_limit_is_a_timeout:
TIMEOUT -> failed 'timeout'); the worker records a launcher outcome's error kind the same way for every kind
(worker.execution._finish, tested on the local path in tests/worker).

The cluster is 4 'GPUs' (gloo ranks) per node, 1 node, 2 Slurm tasks per node: the one node of this Slurm
stands in for two (gpus_per_node 2 x max_nodes 2 would ask Slurm for 2 nodes, which this one-node Slurm
cannot give). --overcommit: 4 ranks on 2 CPUs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from osutil import procs
from worker.launchers.base import LaunchHandle

from ..worker.conftest import WorkerProc, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "slurm-cpu"
HEARTBEAT_S, LEASE_S = 1.0, 4.0
TINY = {
    "model": "debug",
    "precisions": ["fp32"],
    "layouts": ["fsdp"],
    "seq_len": 32,
    "local_batch_size": 1,
    "steps": 3,
    "warmup_steps": 1,
    "timeout_s": 600,
}
CLUSTERS_TOML = """\
[[cluster]]
name = "{name}"
vendor = "cpu"
device_name = "cpu (gloo ranks)"
gpus_per_node = 4
max_nodes = 1
launcher = "slurm"

[cluster.slurm]
tasks_per_node = 2
shared_dir = "{shared_dir}"
extra_args = ["--overcommit"]
"""


class Service:
    """The API client, the worker environment and the Slurm side of one test."""

    def __init__(self, tmp: Path, api, env: dict[str, str]):
        self.tmp, self.api, self.env = tmp, api, env
        self.workers: list[WorkerProc] = []

    def start_worker(self, env_extra: dict[str, str] | None = None) -> WorkerProc:
        log_path = self.tmp / f"worker-{len(self.workers)}.log"
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.main:app",
            "worker",
            "-n",
            f"slurm-{len(self.workers)}@%h",
            "-Q",
            CLUSTER,
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--prefetch-multiplier",
            "1",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=self.env | (env_extra or {}),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        worker = WorkerProc(proc, log_path)
        self.workers.append(worker)
        worker.wait_ready()
        return worker

    def submit(self, **spec) -> list[int]:
        body = {"name": "slurm service test", "cluster": CLUSTER, "gpu_counts": [2]} | TINY | spec
        response = self.api.post("/experiments", json=body)
        assert response.status_code == 201, response.text
        assert response.json()["dispatched"], response.json()
        return [r["id"] for r in response.json()["runs"]]

    def run(self, run_id: int) -> dict:
        response = self.api.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_status(self, run_id: int, statuses: tuple[str, ...], timeout_s: float) -> dict:
        try:
            return wait_until(
                lambda: (r := self.run(run_id))["status"] in statuses and r,
                timeout_s,
                f"run {run_id} to reach {statuses}",
                interval_s=0.5,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics(run_id)}") from None

    def diagnostics(self, run_id: int) -> str:
        dirs = self.run_dirs(run_id)
        log = dirs[-1] / "log.txt" if dirs else self.tmp / "runs" / f"run-{run_id}" / "log.txt"
        parts = [f"run: {self.run(run_id)}", f"job log: {log.read_text()[-2000:] if log.exists() else '(none)'}"]
        parts += [f"{w.log_path.name}: {w.log()[-3000:]}" for w in self.workers]
        return "\n".join(parts)

    def run_dirs(self, run_id: int) -> list[Path]:
        """The run's directories, one per claim that launched it (run-N/lease-K), oldest first."""
        found = (self.tmp / "runs" / f"run-{run_id}").glob("lease-*")
        return sorted((p for p in found if p.name[6:].isdigit()), key=lambda p: int(p.name[6:]))

    def run_dir(self, run_id: int) -> Path:
        """The directory of the run's newest launch (a re-attaching claim keeps it)."""
        return self.run_dirs(run_id)[-1]

    def jobs(self) -> dict[str, dict[str, str]]:
        """Jobs the controller knows (MinJobAge keeps finished ones) that run in this test's run dirs."""
        out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30).stdout
        found = {}
        for line in out.splitlines():
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if fields.get("WorkDir", "").startswith(str(self.tmp / "runs")):
                found[fields["JobId"]] = fields
        return found

    def reap_once(self) -> str:
        """One pass of the real scheduler's reaper (`python -m worker.scheduler --once`)."""
        proc = subprocess.run(
            [sys.executable, "-m", "worker.scheduler", "--once"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr


@pytest.fixture
def service(
    slurm_up, tmp_path: Path, pg_url: str, redis_url: str, pg_session_factory, redis_client, make_client
) -> Iterator[Service]:
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(CLUSTERS_TOML.format(name=CLUSTER, shared_dir=tmp_path / "runs"))
    settings = Settings(
        data_dir=tmp_path,
        database_url=pg_url,
        broker_url=redis_url,
        clusters_file=str(clusters),
        runs_dir=tmp_path / "runs",
        heartbeat_s=HEARTBEAT_S,
        lease_s=LEASE_S,
        max_infra_retries=1,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        SCALEBENCH_DATABASE_URL=pg_url,
        SCALEBENCH_BROKER_URL=redis_url,
        SCALEBENCH_DATA_DIR=str(tmp_path),
        SCALEBENCH_RUNS_DIR=str(tmp_path / "runs"),
        SCALEBENCH_CLUSTERS_FILE=str(clusters),
        SCALEBENCH_HEARTBEAT_S=str(HEARTBEAT_S),
        SCALEBENCH_LEASE_S=str(LEASE_S),
        SCALEBENCH_MAX_INFRA_RETRIES="1",
        PYTHONUNBUFFERED="1",
    )
    svc = Service(tmp_path, make_client(settings=settings), env)
    yield svc
    # Nothing of this test may outlive it: its Slurm jobs first (a worker's warm shutdown waits for its tasks).
    if svc.jobs():
        subprocess.run(["scancel", *svc.jobs()], capture_output=True, timeout=30)
    for w in svc.workers:
        w.stop()
    procs.signal_pids(
        [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _names(p, tmp_path)], signal.SIGKILL
    )


def _names(proc_dir: Path, tmp: Path) -> bool:
    try:
        return str(tmp).encode() in (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False


def _slurm_state(svc: Service, job_id: str) -> str:
    return svc.jobs().get(job_id, {}).get("JobState", "?")


def _wait_job_running(svc: Service, run_id: int, timeout_s: float = 60) -> dict:
    """Until Slurm runs the run's job and the worker has shown it as `running` (after `pending`)."""

    def running() -> dict | None:
        run = svc.run(run_id)
        job_id = run["slurm_job_id"]
        ok = run["status"] == "running" and job_id and _slurm_state(svc, job_id) == "RUNNING"
        return run if ok else None

    try:
        return wait_until(running, timeout_s, f"run {run_id}'s Slurm job to run", interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{svc.diagnostics(run_id)}") from None


def test_results_of_2_and_4_ranks_pending_while_queued(service: Service):
    """Both runs wait in Slurm's queue at once (an exclusive job holds the node): `pending` with job ids, one
    worker holding both (threads pool); then they run and their results are recorded."""
    blocker = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            "--job-name=scalebench-blocker",
            f"--chdir={service.tmp}",
            "--output=/dev/null",
            "--wrap=sleep 300",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip().split(";")[0]
    try:
        service.start_worker()
        run_ids = service.submit(gpu_counts=[2, 4])
        pending = [service.wait_status(i, ("pending",), timeout_s=30) for i in run_ids]
        job_ids = [r["slurm_job_id"] for r in pending]
        assert all(j and j.isdigit() for j in job_ids) and len(set(job_ids)) == 2, pending
        assert {_slurm_state(service, j) for j in job_ids} == {"PENDING"}
    finally:
        subprocess.run(["scancel", blocker_id], capture_output=True, timeout=30)
    for run_id, job_id in zip(run_ids, job_ids):
        run = service.wait_status(run_id, ("succeeded", "failed", "cancelled"), timeout_s=600)
        assert run["status"] == "succeeded", service.diagnostics(run_id)
        assert run["slurm_job_id"] == job_id and run["attempts"] == 1
        env = run["result"]["environment"]
        assert env["world_size"] == run["num_devices"] and env["backend"] == "gloo"
        assert run["summary"] is not None and len(service.api.get(f"/runs/{run_id}/steps").json()) == 3
        script = (service.run_dir(run_id) / "job.sbatch").read_text()
        assert "srun --ntasks=2 --ntasks-per-node=2" in script
        assert f"--nproc-per-node={run['num_devices'] // 2}" in script
    assert len(service.jobs()) == 2  # one sbatch per run


def test_cancel_through_the_api_scancels(service: Service):
    service.start_worker()
    (run_id,) = service.submit(steps=100000)
    run = _wait_job_running(service, run_id)
    job_id = run["slurm_job_id"]
    response = service.api.post(f"/experiments/{run['experiment_id']}/cancel")
    assert response.status_code == 200 and response.json()["num_cancel_requested"] == 1, response.text
    t0 = time.monotonic()
    run = service.wait_status(run_id, ("cancelled", "succeeded", "failed"), timeout_s=20)
    assert run["status"] == "cancelled" and run["error_kind"] == "cancelled", service.diagnostics(run_id)
    assert time.monotonic() - t0 < 10
    wait_until(lambda: _slurm_state(service, job_id) == "CANCELLED", 20, f"job {job_id} to be CANCELLED")
    spec_arg = str(service.run_dir(run_id) / "spec.json")
    wait_until(lambda: not procs.pids_with_arg(spec_arg), 20, "the job's ranks to exit after scancel")


def test_worker_killed_while_its_job_runs_a_new_worker_reattaches(service: Service):
    first = service.start_worker()
    (run_id,) = service.submit(steps=150)
    run = _wait_job_running(service, run_id)
    job_id = run["slurm_job_id"]
    os.killpg(first.pid, signal.SIGKILL)
    first.proc.wait()
    second = service.start_worker()
    # The lease runs out; the reaper requeues the run (no attempt spent) and publishes it; the new worker claims
    # it and, finding handle.json, re-attaches to the job instead of submitting it again.
    time.sleep(LEASE_S + 1)  # no heartbeat since the kill: the lease has run out
    reaper_log = service.reap_once()
    assert "requeued to re-attach" in reaper_log and "cancelled its Slurm job" not in reaper_log, reaper_log
    assert _slurm_state(service, job_id) == "RUNNING", "the reaper must leave a live job alone"
    wait_until(lambda: f"re-attached to Slurm job {job_id}" in second.log(), 30, "the new worker to re-attach")
    run = service.wait_status(run_id, ("succeeded", "failed", "cancelled"), timeout_s=600)
    assert run["status"] == "succeeded", service.diagnostics(run_id)
    assert run["slurm_job_id"] == job_id and run["attempts"] == 1
    assert run["worker"] is not None and str(second.pid) in run["worker"]
    assert LaunchHandle.load(service.run_dir(run_id)).job_id == job_id
    assert list(service.jobs()) == [job_id], "sbatch ran again for a run whose job was alive"
    assert _slurm_state(service, job_id) == "COMPLETED"
    assert len(service.api.get(f"/runs/{run_id}/steps").json()) == 150


def test_worker_killed_between_sbatch_and_handle_json_reattaches_by_job_name(service: Service):
    """The worker dies right after sbatch returned, before it wrote handle.json (an `sbatch` on its PATH that
    runs the real one, then SIGKILLs its caller). The reaper finds the job by its name (scalebench-<run id>)
    and requeues the run without spending an attempt; the next worker re-attaches to that job: one sbatch."""
    real_sbatch = shutil.which("sbatch")
    assert real_sbatch
    bin_dir = service.tmp / "dying-bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\nout=$({real_sbatch} "$@"); rc=$?\nkill -9 $PPID\necho "$out"\nexit $rc\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    first = service.start_worker(env_extra={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    (run_id,) = service.submit(steps=60)
    assert first.proc.wait(60) == -signal.SIGKILL, first.log()[-3000:]
    jobs = wait_until(service.jobs, 30, "the job submitted by the dying worker")
    assert len(jobs) == 1, jobs
    (job_id,) = jobs
    run_dir = service.run_dir(run_id)
    assert not (run_dir / "handle.json").exists() and (run_dir / "job.sbatch").exists()
    run = service.run(run_id)
    assert run["status"] == "running" and run["attempts"] == 1 and run["slurm_job_id"] is None, run

    second = service.start_worker()
    time.sleep(LEASE_S + 1)  # no heartbeat since the kill: the lease has run out
    reaper_log = service.reap_once()
    assert f"found Slurm job {job_id} by its name scalebench-{run_id}" in reaper_log, reaper_log
    assert "requeued to re-attach" in reaper_log, reaper_log
    wait_until(lambda: f"re-attached to Slurm job {job_id}" in second.log(), 30, "the new worker to re-attach")
    run = service.wait_status(run_id, ("succeeded", "failed", "cancelled"), timeout_s=600)
    assert run["status"] == "succeeded", service.diagnostics(run_id)
    assert run["slurm_job_id"] == job_id and run["attempts"] == 1
    assert list(service.jobs()) == [job_id], "sbatch ran again for a run whose job was submitted"
    assert len(service.api.get(f"/runs/{run_id}/steps").json()) == 60
