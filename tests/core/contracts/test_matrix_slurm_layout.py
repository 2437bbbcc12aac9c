"""Matrix expansion on Slurm clusters skips the points the launcher could never split over nodes x tasks."""

import pytest

from core.contracts.clusters import Cluster, SlurmOptions
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import ExperimentSpec


def _cluster(launcher="slurm", vendor="nvidia", gpus_per_node=8, max_nodes=4, **opts) -> Cluster:
    return Cluster(
        name="c1",
        vendor=vendor,
        device_name="NVIDIA H200" if vendor == "nvidia" else "cpu",
        gpus_per_node=gpus_per_node,
        max_nodes=max_nodes,
        launcher=launcher,
        slurm=SlurmOptions(**opts) if launcher == "slurm" else None,
    )


def _spec(gpu_counts):
    return ExperimentSpec(
        name="e", model="debug", cluster="c1", gpu_counts=gpu_counts, precisions=["bf16"], layouts=["ddp"], seq_len=64
    )


def test_uneven_node_split_is_skipped_with_the_launchers_reason():
    runs, skipped = expand(_spec([8, 9, 12, 16]), _cluster())
    assert sorted({r.num_devices for r in runs}) == [8, 12, 16]
    assert [(s.num_devices, s.reason) for s in skipped] == [
        (9, "N=9 does not split evenly over 2 node(s) x 1 task(s) (gpus_per_node=8)")
    ]


def test_fewer_ranks_than_tasks_per_node_is_skipped():
    cpu = _cluster(vendor="cpu", gpus_per_node=4, max_nodes=1, tasks_per_node=2)
    runs, skipped = expand(_spec([1, 2, 3, 4]), cpu)
    assert sorted({r.num_devices for r in runs}) == [2, 4]
    assert {s.num_devices: s.reason for s in skipped} == {
        1: "N=1 does not split evenly over 1 node(s) x 2 task(s) (gpus_per_node=4)",
        3: "N=3 does not split evenly over 1 node(s) x 2 task(s) (gpus_per_node=4)",
    }


def test_only_unlaunchable_points_is_a_matrix_error():
    with pytest.raises(MatrixError, match=r"bf16/ddp/N=9: N=9 does not split evenly over 2 node\(s\)"):
        expand(_spec([9]), _cluster())


def test_local_clusters_keep_their_points():
    # the split rule is Slurm's: a local launcher starts N ranks on one machine
    runs, skipped = expand(_spec([9]), _cluster(launcher="local", max_nodes=2))
    assert [r.num_devices for r in runs] == [9] and skipped == []
