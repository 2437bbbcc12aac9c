"""Clusters: where runs execute. Loaded from a TOML file (path from settings); `local-cpu` always exists.

A cluster may describe its network in a `[cluster.network]` table (core.projection.network.Network): a node `platform`
(h100-hgx, h200-hgx, b200-hgx, mi300x-platform, mi325x-platform, mi355x-platform) and a `nic` (ib-400g,
roce-400g, ib-800g) fill the defaults, and any field beside them overrides one, e.g.

    [[cluster]]
    name = "h100-pod"
    vendor = "nvidia"
    device_name = "NVIDIA H100 80GB HBM3"
    gpus_per_node = 8
    max_nodes = 128
    [cluster.network]
    platform = "h100-hgx"          # NVLink 4 / NVSwitch: 450 GB/s per GPU per direction
    nic = "ib-400g"                # one 400 Gbit/s NIC per GPU
    inter_node_efficiency = 0.75   # optional override

`data_roots = ["/data/tokens"]` names the directories whose files a spec's `data_path` may name (relative to a
root; core.contracts.data_paths); a cluster without it runs on the synthetic stream only.

Projections (GET /experiments/{id}/projection) read the network; runs do not. Without one, a projection assumes the
platform the device name implies with a 400G InfiniBand NIC per GPU, and says so.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from core.contracts import data_paths
from core.contracts.base import Strict
from core.engines.command import CommandEngineConfig, check_command_names
from core.projection.network import Network

# sbatch options a cluster config may add; anything else is refused (values are passed as arguments).
SBATCH_ALLOWED_OPTIONS = (
    "--constraint",
    "--exclusive",
    "--reservation",
    "--mem",
    "--cpus-per-task",
    "--gres",
    "--nodelist",
    "--exclude",
    "--overcommit",
    "--comment",
)


class SlurmOptions(Strict):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = Field(None, description="sbatch --time, e.g. 02:00:00")
    shared_dir: str | None = Field(None, description="Run directories on a path every node sees.")
    extra_args: list[str] = []
    python: str | None = Field(
        None,
        description="Interpreter that runs torchrun and the runner on the nodes "
        "(default: the worker's own, which every node must see).",
    )
    tasks_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description="torchrun agents per node; above 1 only for vendor "
        "'cpu' (a one-node test cluster standing in for several).",
    )

    @field_validator("extra_args")
    @classmethod
    def _allowed(cls, v: list[str]) -> list[str]:
        for arg in v:
            opt = arg.split("=", 1)[0]
            if opt not in SBATCH_ALLOWED_OPTIONS:
                raise ValueError(
                    f"slurm extra_args: {opt!r} is not allowed; allowed: {', '.join(SBATCH_ALLOWED_OPTIONS)}"
                )
        return v


class Cluster(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    vendor: Literal["nvidia", "amd", "cpu"]
    device_name: str
    gpus_per_node: int = Field(ge=1, le=64)
    max_nodes: int = Field(1, ge=1, le=100000)
    launcher: Literal["local", "slurm"] = "local"
    queue: str = Field("", description="Celery queue of this cluster's workers (default: the cluster name).")
    slurm: SlurmOptions | None = None
    network: Network | None = Field(None, description="Links for projections: platform, nic and overrides.")
    torchtitan: bool = Field(
        False,
        description="TorchTitan (the `torchtitan` extra) is installed on the nodes: "
        "the cluster offers engine `torchtitan`.",
    )
    engines: dict[str, CommandEngineConfig] = Field(
        {}, description="Command engines ([cluster.engines.<name>]): requests name them as `command:<name>`."
    )
    data_roots: list[str] = Field(
        [],
        max_length=32,
        description="Directories on the nodes whose regular files a spec's data_path may name (relative to one); "
        "none: runs use the synthetic stream only (core.contracts.data_paths).",
    )

    @field_validator("data_roots")
    @classmethod
    def _absolute_roots(cls, v: list[str]) -> list[str]:
        out = []
        for root in v:
            if not root.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in root):
                raise ValueError(f"data_roots: {root!r} must be an absolute directory path without control characters")
            if root.rstrip("/") == "":
                raise ValueError("data_roots: '/' would allow every file on the node; name the data directories")
            # Refused here, not relaxed in data_paths.resolve: the file's whole real path, root included, fills
            # command-engine templates ({data_path}), where a space or ':' would split or change an argument.
            problem = data_paths.root_problem(os.path.normpath(root))
            if problem:
                raise ValueError(f"data_roots: {problem}")
            out.append(os.path.normpath(root))
        return out

    @field_validator("engines")
    @classmethod
    def _engine_names(cls, v: dict[str, CommandEngineConfig]) -> dict[str, CommandEngineConfig]:
        return check_command_names(v)

    @property
    def max_devices(self) -> int:
        return self.gpus_per_node * self.max_nodes

    @property
    def device_type(self) -> Literal["cpu", "cuda"]:
        # ROCm builds of torch expose AMD GPUs as "cuda" devices.
        return "cpu" if self.vendor == "cpu" else "cuda"

    @property
    def queue_name(self) -> str:
        return self.queue or self.name


LOCAL_CPU = Cluster(
    name="local-cpu",
    vendor="cpu",
    device_name="cpu (gloo ranks)",
    gpus_per_node=4,
    max_nodes=1,
    launcher="local",
    queue="local-cpu",
)


def load_clusters(path: str | Path | None) -> dict[str, Cluster]:
    """Clusters from a TOML file of [[cluster]] tables, plus the built-in local-cpu (unless redefined)."""
    clusters = {LOCAL_CPU.name: LOCAL_CPU}
    if not path:
        return clusters
    p = Path(path)
    if not p.exists():
        raise ValueError(f"clusters file {str(p)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"clusters file {str(p)!r}: {exc}") from exc
    for i, entry in enumerate(data.get("cluster", [])):
        try:
            cluster = Cluster.model_validate(entry)
        except ValidationError as exc:
            raise ValueError(f"clusters file {str(p)!r}, cluster[{i}]: {exc}") from exc
        clusters[cluster.name] = cluster
    return clusters
