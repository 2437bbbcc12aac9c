"""clusters.toml text for tests: one cluster with a [cluster.network] table, so that /projection and /plan answer."""

from __future__ import annotations


def networked_cluster_toml(
    name: str, device_name: str, max_nodes: int, platform: str, *, nic: str = "ib-400g", vendor: str = "nvidia"
) -> str:
    """One [[cluster]] of 8 GPUs per node on a platform preset and a NIC preset (core.projection.network)."""
    return f"""
[[cluster]]
name = "{name}"
vendor = "{vendor}"
device_name = "{device_name}"
gpus_per_node = 8
max_nodes = {max_nodes}

[cluster.network]
platform = "{platform}"
nic = "{nic}"
"""
