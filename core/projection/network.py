"""A cluster's network, and what a collective costs on it (pure; an alpha-beta model of NCCL/RCCL rings and trees).

The description (a `[cluster.network]` table in clusters.toml) names a node platform, which fills the
intra-node link, and a NIC, which fills the inter-node link; any field given beside them overrides the
default. Bandwidths are per GPU and per direction, in GB/s (10^9 bytes/s); NIC line rates in Gbit/s.

Collective cost (one communicator of `size` ranks, `ranks_per_node` of them on each node it spans):

- ring all-gather / reduce-scatter of S bytes (the full, gathered size): each rank moves S (n-1)/n bytes
  at the ring's bus bandwidth, plus one latency per ring step. A ring that crosses nodes leaves and enters
  each node once per channel; with one channel per NIC (rail-aligned rings), a node's NICs together carry
  the traffic that one GPU's NVLink carries, so the bus bandwidth is min(intra-node per GPU,
  inter-node per GPU x ranks of the group on the node). nccl-tests' PERFORMANCE.md defines bus bandwidth.
- all-reduce: the faster of a ring (reduce-scatter + all-gather: 2 S (n-1)/n bytes, 2 (n-1) steps) and a
  tree (same bandwidth term, log2(nodes) network hops up and down instead of n-1 steps).
- latency: NCCL's own tuning model (src/graph/tuning.cc, Simple protocol): a base of 8.4 us per call, then
  per ring step 3.4 us over NVLink and 14 us over the network; the defaults below use those numbers.
- efficiency: achieved bus bandwidth / nominal link bandwidth (large messages). An assumption, reported
  with every answer, and the factor a calibration fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from core.contracts.base import Strict
from core.projection.constants import (
    COLLECTIVE_UNITS,
    DEVICE_SPEED_CV,
    INTER_NODE_EFFICIENCY,
    INTRA_NODE_EFFICIENCY,
    STRAGGLER_TAIL,
)

# SMs (NVIDIA) / CUs (AMD) per device, vendor datasheets.
COMPUTE_UNITS = {
    "h100-hgx": 132,
    "h200-hgx": 132,
    "b200-hgx": 148,
    "mi300x-platform": 304,
    "mi325x-platform": 304,
    "mi355x-platform": 256,
    "gb200-nvl72": 148,
}
# Node platforms: per-GPU intra-node bandwidth per direction (GB/s), from the vendors' datasheets, and the share of
# compute units a running collective takes (COLLECTIVE_UNITS of the device's SMs or CUs).
INTRA_NODE_GB_PER_S: dict[str, float] = {
    # NVIDIA H100 SXM / HGX H100: NVLink 4, 18 links, 900 GB/s bidirectional per GPU through NVSwitch.
    "h100-hgx": 450.0,
    # NVIDIA H200 SXM / HGX H200: the same NVLink 4 / NVSwitch fabric, 900 GB/s bidirectional per GPU.
    "h200-hgx": 450.0,
    # NVIDIA HGX B200: NVLink 5, 1.8 TB/s bidirectional per GPU through NVSwitch.
    "b200-hgx": 900.0,
    # AMD Instinct MI300X platform: 7 Infinity Fabric (xGMI) links per GPU, one to each peer (no switch),
    # 128 GB/s bidirectional each (896 GB/s aggregate): 7 x 64 GB/s per direction when every link is busy.
    "mi300x-platform": 448.0,
    # AMD Instinct MI325X platform: the same Infinity Fabric as MI300X (896 GB/s aggregate).
    "mi325x-platform": 448.0,
    # AMD Instinct MI355X platform: 7 Infinity Fabric links of 153.6 GB/s bidirectional (1075 GB/s aggregate).
    "mi355x-platform": 537.6,
    # NVIDIA GB200 NVL72: 72 Blackwell GPUs in one NVLink domain (NVLink 5 switch trays), 1.8 TB/s bidirectional
    # per GPU, 130 TB/s for the rack (NVIDIA GB200 NVL72 product page and datasheet).
    "gb200-nvl72": 900.0,
}
# GPUs that share one NVLink / Infinity Fabric domain, where it is larger than the node a cluster declares (a rack).
NVLINK_DOMAIN_GPUS: dict[str, int] = {"gb200-nvl72": 72}
# NCCL's PAT algorithm (all-gather / reduce-scatter, NCCL 2.23+, one GPU per node) is assumed on NVIDIA platforms
# only: RCCL 2.21.5 (ROCm 6.3) tunes all-gather and reduce-scatter over ring, NVLS and CollNet (src/graph/tuning.cc),
# without PAT, so on AMD platforms they run as rings.
PAT_PLATFORMS = frozenset({"h100-hgx", "h200-hgx", "b200-hgx", "gb200-nvl72"})
PLATFORMS: dict[str, dict[str, Any]] = {
    name: {
        "intra_node_gb_per_s": gb_per_s,
        "collective_sm_fraction": COLLECTIVE_UNITS / COMPUTE_UNITS[name],
        "nvlink_domain_gpus": NVLINK_DOMAIN_GPUS.get(name),
        "pat": name in PAT_PLATFORMS,
    }
    for name, gb_per_s in INTRA_NODE_GB_PER_S.items()
}
# Device name substring (lower case) -> platform, for clusters that describe no network.
PLATFORM_OF_DEVICE = (
    ("gb200", "gb200-nvl72"),
    ("h200", "h200-hgx"),
    ("h100", "h100-hgx"),
    ("b200", "b200-hgx"),
    ("mi355", "mi355x-platform"),
    ("mi350", "mi355x-platform"),  # MI350X: the MI355X's 256 CUs and 7 Infinity Fabric links, at a lower clock
    ("mi325", "mi325x-platform"),
    ("mi300", "mi300x-platform"),
)

# NICs: line rate per NIC. 400G NDR InfiniBand (ConnectX-7) and 400G RoCE; one per GPU on HGX and MI300X platforms.
NICS: dict[str, dict[str, Any]] = {
    "ib-400g": {"nic_gbit_per_s": 400.0, "nics_per_gpu": 1.0},
    "roce-400g": {"nic_gbit_per_s": 400.0, "nics_per_gpu": 1.0},
    "ib-800g": {"nic_gbit_per_s": 800.0, "nics_per_gpu": 1.0},
    # AMD Pensando Pollara 400 AI NIC: 400 Gb/s Ethernet (RoCEv2, UEC-ready), one per GPU on MI300X-class platforms.
    "pollara-400g": {"nic_gbit_per_s": 400.0, "nics_per_gpu": 1.0},
}

# NCCL src/graph/tuning.cc, Ring / Simple protocol: baseLat 8.4 us; hwLat NVLink 3.4 us, NET 14.0 us per step.
NCCL_BASE_LATENCY_US = 8.4
NCCL_RING_NVLINK_STEP_US = 3.4
NCCL_RING_NET_STEP_US = 14.0
# PAT (src/graph/tuning.cc, NCCL 2.29): base 8.0 us, then log2(nodes) x (net latency / 3.5) plus 2.8 us per rank,
# and 0.75 of the ring's bus bandwidth; enabled only with one GPU per node (nNodes == nRanks).
NCCL_PAT_BASE_LATENCY_US = 8.0
NCCL_PAT_PER_RANK_US = 2.8
NCCL_PAT_LOG_DIVISOR = 3.5
NCCL_PAT_BANDWIDTH_SHARE = 0.75


class Network(Strict):
    """Per-GPU links of a cluster. `platform` and `nic` fill defaults; explicit fields win."""

    platform: str | None = Field(None, description=f"Node platform default: {', '.join(PLATFORMS)}.")
    nic: str | None = Field(None, description=f"NIC default: {', '.join(NICS)}.")
    intra_node_gb_per_s: float = Field(gt=0, description="Intra-node bandwidth per GPU per direction, GB/s.")
    intra_node_latency_us: float = Field(NCCL_RING_NVLINK_STEP_US, ge=0, description="Per ring step inside a node.")
    nic_gbit_per_s: float = Field(gt=0, description="Line rate of one NIC, Gbit/s.")
    nics_per_gpu: float = Field(1.0, gt=0, description="NICs per GPU (0.5: one NIC shared by two GPUs).")
    inter_node_latency_us: float = Field(NCCL_RING_NET_STEP_US, ge=0, description="Per ring step across nodes.")
    call_latency_us: float = Field(NCCL_BASE_LATENCY_US, ge=0, description="Fixed cost of one collective call.")
    intra_node_efficiency: float = Field(
        INTRA_NODE_EFFICIENCY, gt=0, le=1, description="Achieved / nominal bus bandwidth, intra."
    )
    inter_node_efficiency: float = Field(
        INTER_NODE_EFFICIENCY, gt=0, le=1, description="Achieved / nominal bus bandwidth, inter."
    )
    collective_sm_fraction: float = Field(
        COLLECTIVE_UNITS / COMPUTE_UNITS["h100-hgx"],
        ge=0,
        lt=1,
        description="Share of the device's compute units a running collective occupies: compute overlapped with "
        "communication runs this much slower (fitted on published results, bench/published).",
    )
    device_speed_cv: float = Field(
        DEVICE_SPEED_CV,
        ge=0,
        lt=0.5,
        description="Spread (std / mean) of device speed across same-SKU devices; a step waits for the slowest of "
        "the N devices.",
    )
    nvlink_domain_gpus: int | None = Field(
        None,
        ge=1,
        description="GPUs that share the intra-node fabric when the domain is larger than a node (72 on GB200 "
        "NVL72); None: the cluster's gpus_per_node.",
    )
    pat: bool = Field(
        False,
        description="NCCL's PAT all-gather / reduce-scatter is available (NVIDIA platforms; one GPU per node).",
    )
    straggler_tail: Literal["exponential", "normal"] = Field(
        STRAGGLER_TAIL,
        description="Shape of the slow tail of device speeds: 'exponential' (a few slow devices; the slowest of N "
        "lies H_N - 1 standard deviations behind the mean, growing as ln N) or 'normal' (the expected "
        "maximum of N normal draws, growing as sqrt(2 ln N)).",
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for key, table in (("platform", PLATFORMS), ("nic", NICS)):
            name = data.get(key)
            if name is not None and name not in table:
                raise ValueError(f"network.{key}: unknown {key} {name!r}; allowed: {', '.join(table)}")
            if name is not None:
                out |= {k: v for k, v in table[name].items() if k in cls.model_fields}
        return out | data

    @property
    def inter_node_gb_per_s(self) -> float:
        """Per GPU per direction: its NICs' line rate in GB/s."""
        return self.nic_gbit_per_s * self.nics_per_gpu / 8.0


def default_network(device_name: str) -> tuple[Network | None, str]:
    """The platform a device name implies, with a 400G InfiniBand NIC per GPU; None when unknown."""
    name = device_name.lower()
    for match, platform in PLATFORM_OF_DEVICE:
        if match in name:
            return Network.model_validate(
                {"platform": platform, "nic": "ib-400g"}
            ), f"{platform} + ib-400g (from device {device_name!r})"
    return None, f"no network known for device {device_name!r}"


# ---------------------------------------------------------------------------------------------- costs


@dataclass(frozen=True)
class Group:
    """Placement of one communicator: `size` ranks, `ranks_per_node` of them on each node it spans."""

    size: int
    ranks_per_node: int

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.size / self.ranks_per_node)


@dataclass(frozen=True)
class Cost:
    time_us: float
    bandwidth_us: float
    latency_us: float
    bus_gb_per_s: float  # bus bandwidth used (0 for a group of one)
    bound: str  # "none" | "intra-node" | "inter-node"
    algorithm: str = "none"  # "ring" | "pat" | "tree": the one NCCL's tuning model would pick (the fastest)


NO_COST = Cost(0.0, 0.0, 0.0, 0.0, "none")


def bus_bandwidth(net: Network, group: Group) -> tuple[float, str]:
    """Achieved ring bus bandwidth (GB/s per rank) and the link that binds it."""
    intra = net.intra_node_gb_per_s * net.intra_node_efficiency
    if group.num_nodes == 1:
        return intra, "intra-node"
    inter = net.inter_node_gb_per_s * net.inter_node_efficiency * group.ranks_per_node
    if group.ranks_per_node > 1 and intra < inter:
        return intra, "intra-node"
    return inter, "inter-node"


def _ring_latency_us(net: Network, group: Group, steps_per_pass: int) -> float:
    inter_steps = (group.num_nodes - 1) * steps_per_pass
    intra_steps = (group.size - 1) * steps_per_pass - inter_steps
    return net.call_latency_us + intra_steps * net.intra_node_latency_us + inter_steps * net.inter_node_latency_us


def pat_latency_us(net: Network, group: Group) -> float:
    """NCCL's PAT all-gather / reduce-scatter latency: log-depth across nodes, plus a small linear part per rank."""
    return (
        NCCL_PAT_BASE_LATENCY_US
        + math.log2(group.num_nodes) * net.inter_node_latency_us / NCCL_PAT_LOG_DIVISOR
        + group.size * NCCL_PAT_PER_RANK_US
    )


def all_gather(net: Network, group: Group, num_bytes: float) -> Cost:
    """All-gather (or reduce-scatter) whose gathered (unsharded) size is num_bytes: a ring, or PAT where NCCL
    offers it (one rank per node, `net.pat`) and its tuning model predicts it faster."""
    if group.size <= 1 or num_bytes <= 0:
        return NO_COST
    bw, bound = bus_bandwidth(net, group)
    bandwidth_us = num_bytes * (group.size - 1) / group.size / (bw * 1e3)  # GB/s = 1e3 bytes/us
    latency_us = _ring_latency_us(net, group, 1)
    ring = Cost(bandwidth_us + latency_us, bandwidth_us, latency_us, bw, bound, "ring")
    if net.pat and group.ranks_per_node == 1 and group.num_nodes > 1:
        pat_bw_us = bandwidth_us / NCCL_PAT_BANDWIDTH_SHARE
        pat_lat_us = pat_latency_us(net, group)
        if pat_bw_us + pat_lat_us < ring.time_us:
            return Cost(pat_bw_us + pat_lat_us, pat_bw_us, pat_lat_us, bw * NCCL_PAT_BANDWIDTH_SHARE, bound, "pat")
    return ring


reduce_scatter = all_gather  # the same algorithms, the same bytes on every link


def all_reduce(net: Network, group: Group, num_bytes: float) -> Cost:
    """The faster of a ring and a (double binary) tree all-reduce of num_bytes per rank."""
    if group.size <= 1 or num_bytes <= 0:
        return NO_COST
    bw, bound = bus_bandwidth(net, group)
    bandwidth_us = 2 * num_bytes * (group.size - 1) / group.size / (bw * 1e3)
    ring_us = _ring_latency_us(net, group, 2)
    tree_hops = math.ceil(math.log2(group.num_nodes)) if group.num_nodes > 1 else 0
    tree_us = net.call_latency_us + 2 * (
        tree_hops * net.inter_node_latency_us + (group.ranks_per_node - 1) * net.intra_node_latency_us
    )
    latency_us = min(ring_us, tree_us)
    algorithm = "ring" if ring_us <= tree_us else "tree"
    return Cost(bandwidth_us + latency_us, bandwidth_us, latency_us, bw, bound, algorithm)


def point_to_point(net: Network, same_node: bool, num_bytes: float) -> Cost:
    """One send / receive of num_bytes between two ranks (pipeline stage boundaries)."""
    if num_bytes <= 0:
        return NO_COST
    bw = (
        net.intra_node_gb_per_s * net.intra_node_efficiency
        if same_node
        else net.inter_node_gb_per_s * net.inter_node_efficiency
    )
    lat = net.call_latency_us + (net.intra_node_latency_us if same_node else net.inter_node_latency_us)
    bandwidth_us = num_bytes / (bw * 1e3)
    return Cost(bandwidth_us + lat, bandwidth_us, lat, bw, "intra-node" if same_node else "inter-node", "p2p")
