"""The Slurm launcher against a real one-node Slurm: runs of 2 and 4 CPU ranks over 2 tasks, re-attach from
handle.json, cancel (scancel) and a job killed at its time limit. ~2-3 minutes (the time limit is a minute)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from core.contracts.specs import RunSpec
from osutil import procs
from worker.launchers.base import LaunchHandle
from worker.launchers.slurm import SlurmLauncher, parse_sacct, query_job

from .conftest import CLUSTER, debug_spec, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _check_result(out, spec: RunSpec, run_dir: Path) -> None:
    log = (run_dir / "log.txt").read_text()
    assert out.state == "succeeded", f"{out.error_kind}: {out.message}\n{log[-3000:]}"
    assert out.result is not None and out.result.run_key == spec.run_key()
    assert out.result.environment is not None and out.result.environment.world_size == spec.num_devices
    assert out.result.summary is not None and out.result.summary.tokens_per_step == spec.tokens_per_step
    assert out.result.environment.backend == "gloo" and len(out.result.steps) == spec.steps
    assert "[scalebench] job" in log and "rendezvous" in log


def test_two_ranks_over_two_tasks_and_reattach(launcher, tmp_path):
    """A worker that loses its launcher mid-run re-attaches through handle.json and collects the result."""
    spec, run_dir = debug_spec(2), tmp_path / "r2"
    handle = launcher.start(spec, "r2", run_dir)
    assert handle.job_id and handle.job_id.isdigit()
    assert LaunchHandle.load(run_dir).job_id == handle.job_id
    assert launcher.poll(handle).state in ("pending", "running")
    first_job = handle.job_id
    del launcher, handle  # the worker restarts: nothing in memory survives
    fresh = SlurmLauncher(CLUSTER, query_interval_s=1.0)
    handle = fresh.attach(run_dir)
    assert handle is not None and handle.job_id == first_job and handle.launcher == "slurm"
    out = wait_until(fresh, handle, set(), timeout_s=120)
    _check_result(out, spec, run_dir)
    script = (run_dir / "job.sbatch").read_text()
    assert "srun --ntasks=2 --ntasks-per-node=2" in script and "--nproc-per-node=1" in script
    assert _num_jobs_in(run_dir) == 1  # re-attached, not submitted again


def test_four_ranks_over_two_tasks(launcher, tmp_path, slurm_up):
    spec, run_dir = debug_spec(4), tmp_path / "r4"
    handle = launcher.start(spec, "r4", run_dir)
    out = wait_until(launcher, handle, set(), timeout_s=150)
    _check_result(out, spec, run_dir)
    assert "--nnodes=2 --nproc-per-node=2" in (run_dir / "job.sbatch").read_text()
    job = query_job(handle.job_id)
    assert job is not None and (job.state, job.exit_code) == ("COMPLETED", 0)
    if slurm_up == "slurmdbd":  # accounting answers too, for when the job has left the controller
        assert _sacct_state(handle.job_id) == "COMPLETED"


def test_cancel(launcher, tmp_path, slurm_up):
    spec, run_dir = debug_spec(2, steps=100000), tmp_path / "rc"
    handle = launcher.start(spec, "rc", run_dir)
    assert wait_until(launcher, handle, {"running"}, timeout_s=60).state == "running"
    launcher.cancel(handle)
    out = wait_until(launcher, handle, set(), timeout_s=60)
    assert (out.state, out.error_kind) == ("cancelled", "cancelled"), out.message
    assert not _job_processes(run_dir), "ranks survived scancel"
    if slurm_up == "slurmdbd":
        assert _sacct_state(handle.job_id) == "CANCELLED"


def test_time_limit_is_a_timeout(launcher, tmp_path, slurm_up):
    """timeout_s=60 -> --time=1 min; Slurm checks limits every ~30 s, so this takes 60-95 s."""
    spec, run_dir = debug_spec(2, steps=100000, timeout_s=60), tmp_path / "rt"
    handle = launcher.start(spec, "rt", run_dir)
    assert "--time=0-00:01:00" in handle.extra["sbatch_args"]
    # The job only has to outlive its limit, not to train fast: at the lowest CPU priority it leaves the
    # machine's cores to the tests running beside it (make test runs two pytest processes).
    niced: set[int] = set()
    out = wait_until(launcher, handle, set(), timeout_s=150, each_poll=lambda: _renice(run_dir, niced))
    assert len(niced) >= 4, niced  # at least the 2 torchrun agents and their 2 ranks (srun names the spec too)
    assert (out.state, out.error_kind) == ("failed", "timeout"), f"{out.message}\n{out.log_tail}"
    assert "TIMEOUT" in out.message and out.result is None
    if slurm_up == "slurmdbd":
        assert _sacct_state(handle.job_id) == "TIMEOUT"


def test_a_job_slurm_does_not_know_is_judged_by_its_result(launcher, tmp_path):
    handle = LaunchHandle(
        run_id="gone", run_dir=str(tmp_path), launcher="slurm", job_id="987654321", started_at=time.time()
    )
    out = launcher.poll(handle)
    assert (out.state, out.error_kind) == ("failed", "result_missing") and "no record of job 987654321" in out.message


def _num_jobs_in(run_dir: Path) -> int:
    """Jobs the controller knows that run in run_dir (sbatch --chdir)."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30).stdout
    return sum(1 for line in out.splitlines() if f" WorkDir={run_dir} " in line)


def _sacct_state(job_id: str) -> str | None:
    """sacct's view (slurmdbd receives the end record a moment after the controller)."""
    for _ in range(40):
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "State,ExitCode,Reason", "-S", "now-1hour", "-j", job_id],
            capture_output=True,
            text=True,
            timeout=30,
        )
        job = parse_sacct(proc.stdout)
        if job is not None and job.state not in ("PENDING", "RUNNING", "COMPLETING"):
            return job.state
        time.sleep(0.25)
    return None


def _renice(run_dir: Path, niced: set[int]) -> None:
    """Nice 19 for the job's processes not yet seen (their command lines name its spec.json)."""
    for pid in set(procs.pids_with_arg(str(run_dir / "spec.json"))) - niced:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, 19)
            niced.add(pid)
        except ProcessLookupError:
            pass


def _job_processes(run_dir: Path) -> list[int]:
    for _ in range(20):
        out = subprocess.run(["pgrep", "-f", str(run_dir / "spec.json")], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split()]
        if not pids:
            return []
        time.sleep(0.5)
    return pids


def test_a_command_engine_runs_once_per_node_under_slurm(slurm_up, tmp_path):
    """engine command:own-stack through the same Slurm launcher: `python -m runner.command` once per node (srun),
    which starts the operator's torchrun; its Megatron-style log is read into the result."""
    import sys

    from core.contracts.matrix import expand
    from core.contracts.specs import ExperimentSpec
    from core.engines.command import CommandEngineConfig

    own = CommandEngineConfig(
        argv=[
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "{nnodes}",
            "--node-rank",
            "{node_rank}",
            "--master-addr",
            "{master_addr}",
            "--master-port",
            "{master_port}",
            "--nproc-per-node",
            "{nproc_per_node}",
            "{code_dir}/examples/own-stack/train.py",
            "--seq-length",
            "{seq_len}",
            "--train-iters",
            "{steps}",
        ],
        metrics="megatron-log",
        precisions=["fp32"],
    )
    cluster = CLUSTER.model_copy(update={"engines": {"own-stack": own}})
    exp = ExperimentSpec(
        name="t",
        model="debug",
        cluster=cluster.name,
        gpu_counts=[2],
        precisions=["fp32"],
        engines=["command:own-stack"],
        seq_len=32,
        steps=5,
        warmup_steps=1,
    )
    spec = expand(exp, cluster)[0][0]
    launcher = SlurmLauncher(cluster, query_interval_s=1.0)
    run_dir = tmp_path / "cmd"
    handle = launcher.start(spec, "cmd", run_dir)
    out = wait_until(launcher, handle, set(), timeout_s=120)
    log = (run_dir / "log.txt").read_text()
    assert out.state == "succeeded", f"{out.error_kind}: {out.message}\n{log[-3000:]}"
    script = (run_dir / "job.sbatch").read_text()
    assert "SCALEBENCH_MASTER_ADDR" in script and "-m runner.command" in script
    assert "torch.distributed.run" not in script  # the command starts its own ranks
    assert out.result.summary.step_time_source == "the command's own figures (log:megatron)"
    assert out.result.summary.num_timed_steps == 4 and "elapsed time per iteration" in log
