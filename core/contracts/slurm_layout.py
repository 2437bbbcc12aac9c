"""How a Slurm cluster lays N ranks out: nodes x tasks per node (one torchrun agent each) x ranks per task.

Pure: the matrix (core.contracts.matrix.expand) skips the points this refuses, and the Slurm launcher
(worker.launchers.slurm) builds its sbatch arguments and job script from it, so both apply one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.contracts.clusters import Cluster, SlurmOptions


@dataclass(frozen=True)
class JobLayout:
    """How N ranks map onto Slurm: nodes x tasks per node (one torchrun agent each) x ranks per task."""

    num_nodes: int
    tasks_per_node: int
    ranks_per_task: int
    gpus_per_node: int | None  # what --gpus-per-node asks for; None on CPU clusters

    @property
    def num_tasks(self) -> int:
        return self.num_nodes * self.tasks_per_node


def job_layout(cluster: Cluster, num_devices: int) -> JobLayout:
    """nodes = ceil(N / gpus_per_node), ranks spread evenly; ValueError naming the numbers when they do not split."""
    opts = cluster.slurm or SlurmOptions()
    tasks_per_node = opts.tasks_per_node
    if tasks_per_node > 1 and cluster.vendor != "cpu":
        raise ValueError(
            f"slurm tasks_per_node({tasks_per_node}) > 1 is for vendor 'cpu' only: the GPUs of a "
            f"node belong to one torchrun agent (cluster {cluster.name!r} is {cluster.vendor!r})"
        )
    num_nodes = math.ceil(num_devices / cluster.gpus_per_node)
    if num_nodes > cluster.max_nodes:
        raise ValueError(
            f"N={num_devices} needs {num_nodes} nodes of {cluster.gpus_per_node}; "
            f"cluster {cluster.name!r} has max_nodes({cluster.max_nodes})"
        )
    num_tasks = num_nodes * tasks_per_node
    if num_devices % num_tasks:
        raise ValueError(
            f"N={num_devices} does not split evenly over {num_nodes} node(s) x "
            f"{tasks_per_node} task(s) (gpus_per_node={cluster.gpus_per_node})"
        )
    ranks_per_task = num_devices // num_tasks
    gpus = None if cluster.vendor == "cpu" else ranks_per_task
    return JobLayout(num_nodes, tasks_per_node, ranks_per_task, gpus)


def layout_reason(cluster: Cluster, num_devices: int) -> str | None:
    """Why a Slurm cluster cannot launch N ranks (job_layout's refusal), or None; always None off Slurm."""
    if cluster.launcher != "slurm":
        return None
    try:
        job_layout(cluster, num_devices)
    except ValueError as exc:
        return str(exc)
    return None
