"""LocalLauncher without a database: the command and environment, a real run, its wall-clock limit."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from core.contracts.clusters import LOCAL_CPU
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec, RunSpec
from osutil import procs
from tests.worker.conftest import TINY, wait_until
from worker.launchers.base import LaunchHandle
from worker.launchers.local import LocalLauncher, outcome_from_run_dir


def _spec(**overrides) -> RunSpec:
    body = {"name": "launcher test", "precisions": ["fp32"], "gpu_counts": [2]} | TINY
    runs, _ = expand(ExperimentSpec(**body), LOCAL_CPU)
    return runs[0].model_copy(update=overrides)


def test_command_is_an_argument_list_and_cpu_ranks_share_the_cores(tmp_path: Path) -> None:
    launcher = LocalLauncher(cpu_count=8)
    spec = _spec()
    cmd = launcher.command(spec, tmp_path)
    assert cmd[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    assert cmd[-4:] == ["--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "result.json")]
    env = launcher.environment(spec)
    assert env["OMP_NUM_THREADS"] == "4" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert (
        LocalLauncher(cpu_count=2).environment(
            _spec(degrees=spec.degrees.model_copy(update={"dp_shard": 4, "world_size": 4}))
        )["OMP_NUM_THREADS"]
        == "1"
    )


def test_nccl_and_visible_devices_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    env = LocalLauncher().environment(_spec(device_type="cuda"))
    assert env["NCCL_DEBUG"] == "INFO" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "OMP_NUM_THREADS" not in env and "OMP_WAIT_POLICY" not in env  # CPU-rank settings only


def test_missing_result_with_exit_codes(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("Traceback ...\nRuntimeError: boom\n")
    failed = outcome_from_run_dir(tmp_path, 1)
    assert (failed.state, failed.error_kind, failed.retryable) == ("failed", "error", False)
    assert "boom" in failed.log_tail and "code 1" in failed.message
    killed = outcome_from_run_dir(tmp_path, -signal.SIGKILL)
    assert (killed.error_kind, killed.retryable) == ("infrastructure", True)
    assert outcome_from_run_dir(tmp_path, 0).error_kind == "result_missing"


@pytest.mark.slow
def test_real_run_then_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    launcher = LocalLauncher(kill_grace_s=3)
    handle = launcher.start(_spec(), "ok", tmp_path / "ok")
    assert LaunchHandle.load(tmp_path / "ok").pid == handle.pid
    outcome = wait_until(lambda: (o := launcher.poll(handle)).state not in ("running", "pending") and o, 120, "run")
    assert outcome.state == "succeeded", outcome.log_tail
    assert outcome.result.summary.tokens_per_sec > 0 and len(outcome.result.steps) == TINY["steps"]

    slow = launcher.start(_spec(steps=100000, timeout_s=8), "slow", tmp_path / "slow")
    spec_arg = slow.extra["spec_arg"]
    wait_until(lambda: len(procs.pids_with_arg(spec_arg)) == 3, 60, "torchrun and 2 ranks")
    t0 = time.monotonic()
    outcome = wait_until(lambda: (o := launcher.poll(slow)).state != "running" and o, 60, "the deadline")
    assert outcome.error_kind == "timeout" and "timeout_s" in outcome.message
    assert time.monotonic() - t0 < 15
    assert procs.pids_with_arg(spec_arg) == []
