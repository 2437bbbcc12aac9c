"""The Slurm launcher refuses an unsplittable N with the same rule and words the matrix skips it with."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from core.contracts import slurm_layout
from core.contracts.clusters import Cluster, SlurmOptions
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec
from worker.launchers import slurm


def _cluster(launcher: Literal["local", "slurm"]) -> Cluster:
    slurm_opts = SlurmOptions() if launcher == "slurm" else None
    return Cluster(
        name="c1",
        vendor="nvidia",
        device_name="NVIDIA H200",
        gpus_per_node=8,
        max_nodes=4,
        launcher=launcher,
        slurm=slurm_opts,
    )


def test_launcher_uses_the_core_rule():
    assert slurm.job_layout is slurm_layout.job_layout and slurm.JobLayout is slurm_layout.JobLayout


def test_launcher_still_refuses_a_point_the_matrix_would_skip(tmp_path: Path):
    # a RunSpec for N=9 made where the matrix allows it (a local cluster), then handed to the Slurm launcher
    exp = ExperimentSpec(
        name="t", model="debug", cluster="c1", gpu_counts=[9], precisions=["bf16"], layouts=["ddp"], seq_len=64
    )
    (run,), _ = expand(exp, _cluster("local"))
    on_slurm = _cluster("slurm")
    message = "N=9 does not split evenly over 2 node(s) x 1 task(s) (gpus_per_node=8)"
    with pytest.raises(ValueError) as info:
        slurm.sbatch_args(on_slurm, run, "r1", tmp_path)
    assert str(info.value) == message
    _, skipped = expand(exp.model_copy(update={"gpu_counts": [8, 9]}), on_slurm)
    assert [s.reason for s in skipped] == [message]
