"""A real one-node Slurm (scripts/slurm-up.sh), a CPU cluster config for it, and polling helpers."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from core.contracts.clusters import Cluster, SlurmOptions
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec, RunSpec
from worker.launchers.base import LaunchOutcome
from worker.launchers.slurm import SlurmLauncher

REPO_ROOT = Path(__file__).resolve().parents[2]
SLURM_UP = REPO_ROOT / "scripts" / "slurm-up.sh"

# One node standing in for two: two torchrun agents (Slurm tasks) per node, each with N/2 gloo ranks.
# --overcommit: the ranks outnumber this machine's 2 CPUs.
CLUSTER = Cluster(
    name="slurm-local",
    vendor="cpu",
    device_name="cpu (gloo ranks)",
    gpus_per_node=4,
    max_nodes=1,
    launcher="slurm",
    slurm=SlurmOptions(tasks_per_node=2, extra_args=["--overcommit"]),
)


@pytest.fixture(scope="session")
def slurm_up() -> str:
    """Starts (or finds) the local Slurm; skips when it cannot be installed here, fails when it will not start."""
    if os.geteuid() != 0:
        pytest.skip("Slurm tests need root: scripts/slurm-up.sh installs slurm-wlm and starts its daemons")
    proc = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 2:
        pytest.skip(f"Slurm cannot be installed here: {out[-500:]}")
    assert proc.returncode == 0, f"scripts/slurm-up.sh failed:\n{out[-3000:]}"
    acct = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    return "slurmdbd" if "accounting_storage/slurmdbd" in acct else "none"


def debug_spec(num_devices: int, steps: int = 4, timeout_s: int = 600) -> RunSpec:
    """A debug-shape run of the real runner on CPU (fp32: no bf16 matmul emulation cost)."""
    exp = ExperimentSpec(
        name="slurm-test",
        model="debug",
        cluster=CLUSTER.name,
        gpu_counts=[num_devices],
        precisions=["fp32"],
        layouts=["fsdp"],
        seq_len=64,
        steps=steps,
        warmup_steps=1,
        timeout_s=timeout_s,
    )
    runs, skipped = expand(exp, CLUSTER)
    assert len(runs) == 1, skipped
    return runs[0]


@pytest.fixture
def launcher(slurm_up) -> SlurmLauncher:
    """The launcher as a worker builds it: the real runner (`python -m runner`) on the worker's interpreter."""
    return SlurmLauncher(CLUSTER, query_interval_s=1.0)


def wait_until(
    launcher: SlurmLauncher, handle, states: set[str], timeout_s: float, each_poll: Callable[[], None] | None = None
) -> LaunchOutcome:
    """Polls until the outcome's state is one of `states` (or the run ended); fails with the log on timeout.
    `each_poll` runs before every poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        if each_poll is not None:
            each_poll()
        out = launcher.poll(handle)
        if out.state in states or out.state not in ("pending", "running"):
            return out
        if time.monotonic() > deadline:
            log = Path(handle.run_dir) / "log.txt"
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            pytest.fail(f"job {handle.job_id} still {out.state} after {timeout_s} s ({out.message}); log:\n{tail}")
        time.sleep(0.5)
