"""Step time of one training step at N devices: compute plus the communication it needs, minus what hides.

Pure (no torch). The model of a step, per layout (the runner's plan: runner/parallel.py):

- FSDP / HSDP (FSDP2, one unit per transformer block plus the root unit of embedding, final norm and output):
  forward all-gathers the root and every block, backward all-gathers every block but the last (kept
  gathered after forward, and the root, which FSDP2 never reshards after forward; none with pp, whose stages keep
  their blocks gathered: Workload.reshard_after_forward), and every unit's
  gradients are reduce-scattered in fp32 (MixedPrecisionPolicy(reduce_dtype=float32)); HSDP then
  all-reduces each shard across replicas. Parameters travel in bf16, or, with fp8 all-gather
  (fp8-tensorwise), the block's linear weights in 1 byte each (norms and the root stay bf16).
  Prefetch hides the next block's all-gather behind this block's compute, and the previous block's
  reduce-scatter behind this block's backward; the first all-gathers and the last reduce-scatters are exposed.
- DDP (replicate, one bucket per block and the root): each bucket's fp32 all-reduce hides behind the next
  block's backward; the last buckets are exposed.
- TP (sequence parallel): per block, forward all-gathers the sequence-sharded activation before attention and
  before the MLP and reduce-scatters after each (2 + 2), backward mirrors them, a full activation
  checkpoint recomputes the forward ones; on the critical path (no async TP). fp8-tensorwise all-gathers
  activations in float8.
- PP: the runner's split of the blocks (ModelShape.pipeline_split: the last stage, which also runs the output
  layer and the loss, takes fewer); the step runs at the slowest stage, its compute the stage's work over the mean
  device's (Workload.stage_compute_factor: blocks and the output layer weighed by time, ModelShape.output_weight;
  the other stages' wait is idle time), times the 1F1B bubble.
- CP: each block's key/value exchange runs beside its attention; a rank's attention costs CP_ATTENTION_COST times
  its FLOP share (measured on the runner's all-gather attention), charged on the attention's share of the step
  (Workload.cp_compute_factor).
- Overlap: a layer takes max(comm, compute + f x comm), f = `collective_sm_fraction`, the share of compute units a
  running collective may take from the compute beside it (COLLECTIVE_UNITS compute units by default, fitted on
  published results: bench/projection_validation.py). With an interleaved pipeline (virtual stages) and overlapped
  data-parallel collectives, a model chunk's gathers and reductions run beside another chunk's P micro-batches, as
  Megatron-Core's interleaved 1F1B launches them; the first chunks' gathers and the last chunk's reductions keep the
  one micro-batch window.
- A step ends at the slowest of the N devices: compute is scaled by 1 + cv x z(N), cv the device-to-device speed
  spread and z(N) how far the slowest of N lies behind the mean in standard deviations: H_N - 1 for an exponential
  tail (the default), or the expected maximum of N standard normal draws (Blom's approximation). The default cv is
  DEVICE_SPEED_CV (fitted, core/projection/constants.py); a cluster's network table may set its own.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from core.catalog.shapes import ModelShape, get_shape
from core.contracts.specs import ParallelDegrees, resolve_layout
from core.contracts.stacks import DP_OVERLAP
from core.projection.constants import CP_ATTENTION_COST
from core.projection.network import Cost, Group, Network, all_gather, all_reduce, point_to_point, reduce_scatter

GRAD_REDUCE_BYTES = 4  # fp32 gradient reduction (the runner's and torchtitan's default MixedPrecisionPolicy)
FWD_SHARE = 1 / 3  # forward / (forward + backward) FLOPs of a matmul layer (backward computes 2 matmuls per 1)


_degrees = lru_cache(maxsize=4096)(resolve_layout)
_shape = lru_cache(maxsize=256)(get_shape)


def cp_attention_cost(cp: int) -> float:
    """A context-parallel rank's attention time over its FLOP share (CP_ATTENTION_COST, measured at C = 2 and 4;
    log-linear in C through them, so extrapolated past 4); 1 at C = 1."""
    if cp <= 1:
        return 1.0
    (c0, f0), (c1, f1) = sorted(CP_ATTENTION_COST.items())
    return f0 + (f1 - f0) * math.log2(cp / c0) / math.log2(c1 / c0)


@lru_cache(maxsize=1024)
def _cp_factor(s: ModelShape, cp: int, seq_len: int) -> float:
    causal = 6 * s.num_layers * s.num_heads * s.head_dim * seq_len
    share = causal / (s.flops_per_token(seq_len) - causal)
    return 1 + share * (cp_attention_cost(cp) - 1)


def stage_factors(split: tuple[int, ...], output_weight: float) -> tuple[float, ...]:
    """Each stage's compute over the mean device's for a split of the blocks (first to last), the last stage also
    running the output layer and the loss, `output_weight` blocks' worth."""
    costs = [*split[:-1], split[-1] + output_weight]
    return tuple(len(split) * c / (sum(split) + output_weight) for c in costs)


@lru_cache(maxsize=4096)
def _stage_costs(shape: ModelShape, pp: int, seq_len: int, compiled: bool) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(blocks per stage, each stage's compute over the mean device's) of the runner's split, the output layer
    weighed by its time (ModelShape.output_weight); pp <= num_layers (more stages than blocks: every block a
    stage, never reached where _fits refuses the layout)."""
    pp = min(pp, shape.num_layers)
    split = shape.pipeline_split(pp, seq_len, compiled)
    return split, stage_factors(split, shape.output_weight(seq_len, compiled))


@dataclass(frozen=True)
class Workload:
    """What one series trains: the shape, precision, layout and batch of its runs."""

    model: str
    num_layers: int
    precision: str
    layout: str
    scaling: str = "weak"  # weak: local batch fixed; strong: global batch fixed
    seq_len: int = 2048
    local_batch_size: int | None = None
    global_batch_size: int | None = None
    fp8_all_gather: bool = False
    activation_checkpointing: str = "none"
    shape: ModelShape | None = None  # a shape outside core.catalog.shapes' table (published results of other models)
    # Sequences per micro-batch: a pipeline's (layouts with pp=P+; None: 1, the runner's; 0: the schedule is unknown),
    # or, without pp, a data-parallel rank's gradient accumulation (None: one micro-batch a step, the runner's)
    micro_batch_size: int | None = None
    # model chunks per pipeline stage (interleaved 1F1B)
    virtual_stages: int = 1
    # Data-parallel communication units: "per-block" (FSDP2: one unit per transformer block, as the runner and
    # TorchTitan wrap them) or "megatron" (Megatron-Core's buckets of max(40M, 1M x DP x CP) parameters, its
    # DistributedDataParallelConfig.bucket_size default: larger DP groups get larger buckets, fewer calls).
    dp_buckets: str = "per-block"
    dp_bucket_params: int | None = None  # "megatron" buckets of this many parameters (the stack's bucket_size)
    # Megatron's distributed optimizer on a ddp layout: a reduce-scatter of the gradients and an all-gather of the
    # parameters (fp8 linears where fp8_all_gather) instead of an all-reduce of the gradients. grad_reduce_bytes:
    # the gradients' reduction dtype (4: fp32, the runner's, TorchTitan's and NeMo's bf16 default; 2: bf16).
    distributed_optimizer: bool = False
    grad_reduce_bytes: int = GRAD_REDUCE_BYTES
    # FSDP after a unit's forward: reshard its parameters and gather them again for the backward (FSDP2's
    # reshard_after_forward), or keep them gathered until the backward (one gather a step, as ZeRO-1/2 and a
    # distributed optimizer make). None: the runner's and TorchTitan's rule, reshard without pp and keep with pp.
    reshard_after_forward: bool | None = None
    # When a step's data-parallel collectives run (see DP_OVERLAP). None: the runner's rule, "reduce-after" with pp
    # (torch.distributed.pipelining reduces FSDP's gradients after the last micro-batch), "overlapped" without.
    dp_overlap: str | None = None
    compile: bool = False  # compiled blocks: the pipeline's last stage weighs its output layer by time (the runner's)

    def __post_init__(self) -> None:
        if self.dp_overlap is not None and self.dp_overlap not in DP_OVERLAP:
            raise ValueError(f"dp_overlap: {self.dp_overlap!r} is not one of {', '.join(DP_OVERLAP)}")

    def model_shape(self) -> ModelShape:
        return self.shape if self.shape is not None else _shape(self.model, self.num_layers)

    def stage_layers(self, n: int) -> int:
        """Transformer blocks the largest pipeline stage holds (all of them without pp): the runner's split,
        ModelShape.pipeline_split (ceil(L / P) or more: the last stage takes fewer for its output layer)."""
        pp = self.degrees(n).pp
        if pp <= 1:
            return self.model_shape().num_layers
        return max(_stage_costs(self.model_shape(), pp, self.seq_len, self.compile)[0])

    def stage_compute_factor(self, n: int, stage: int | None = None) -> float:
        """A pipeline stage's compute over the mean device's (the whole model's work over P): the slowest stage's
        by default, or stage `stage`'s. Blocks and the output layer weighed by time: FLOPs, the output layer's
        scaled where the blocks are compiled (ModelShape.output_weight). 1 without pp."""
        pp = self.degrees(n).pp
        if pp <= 1:
            return 1.0
        _, factors = _stage_costs(self.model_shape(), pp, self.seq_len, self.compile)
        return max(factors) if stage is None else factors[stage]

    def blocks_per_unit(self, n: int) -> int:
        """Transformer blocks that share one data-parallel collective (1 per block unless buckets span more)."""
        if self.dp_buckets != "megatron":
            return 1
        d, s = self.degrees(n), self.model_shape()
        kv = s.num_kv_heads * s.head_dim
        block_params = (2 * s.dim * s.dim + 2 * s.dim * kv + 3 * s.dim * s.ffn_hidden_dim) / d.tp + 2 * s.dim
        bucket_params = self.dp_bucket_params or max(40e6, 1e6 * d.dp_degree * d.cp)
        return max(1, min(self.stage_layers(n), int(bucket_params // block_params)))

    def cp_compute_factor(self, n: int) -> float:
        """A context-parallel rank's compute over its FLOP share: 1 + a x (cp_attention_cost(C) - 1), a the
        attention's share of the step's time, taken as the causal attention's executed FLOPs (half of the
        12 L H head_dim T of flops_per_token) over the rest of the step's. 1 without cp."""
        cp = self.degrees(n).cp
        return _cp_factor(self.model_shape(), cp, self.seq_len) if cp > 1 else 1.0

    def pipeline_micro_batch(self) -> int:
        """Sequences per pipeline micro-batch (0: not known)."""
        return 1 if self.micro_batch_size is None else self.micro_batch_size

    def micro_batches(self, n: int) -> float:
        """Micro-batches a step runs on a data-parallel rank (sequences per rank over micro_batch_size): a pipeline
        stage's, or a gradient accumulation's; 1 where micro_batch_size is 0 (unknown) or, without pp, None."""
        mbs = self.pipeline_micro_batch() if self.degrees(n).pp > 1 else (self.micro_batch_size or 0)
        if mbs <= 0:
            return 1.0
        return max(1.0, self.sequences_per_dp_rank(n) / mbs)

    def interleaved_windows(self, n: int) -> bool:
        """Whether the data-parallel collectives of an interleaved pipeline (virtual stages) run beside the other
        chunks' micro-batches: overlapped mode with pp and v > 1."""
        return self.virtual_stages > 1 and self.degrees(n).pp > 1 and self.dp_overlap_mode(n) == "overlapped"

    def dp_overlap_mode(self, n: int) -> str:
        if self.dp_overlap is not None:
            return self.dp_overlap
        return "reduce-after" if self.degrees(n).pp > 1 else "overlapped"

    def bubble(self, n: int) -> float:
        """Pipelined step over the bubble-free one: 1 + (P - 1) / (virtual stages x micro-batches per pipeline)
        (1F1B and its interleaved form, Narayanan et al., SC21); 1 without pp."""
        pp = self.degrees(n).pp
        if pp <= 1 or self.pipeline_micro_batch() <= 0:  # 0: the schedule is unknown, no bubble modelled
            return 1.0
        return 1 + (pp - 1) / (max(1, self.virtual_stages) * self.micro_batches(n))

    def degrees(self, n: int) -> ParallelDegrees:
        return _degrees(self.layout, n)

    def sequences_per_dp_rank(self, n: int) -> float:
        if self.scaling == "strong":
            if not self.global_batch_size:
                raise ValueError("global_batch_size: strong scaling needs a global batch size (a positive count)")
            return self.global_batch_size / self.degrees(n).dp_degree
        return float(self.local_batch_size or 1)

    def tokens_per_step(self, n: int) -> float:
        return self.sequences_per_dp_rank(n) * self.degrees(n).dp_degree * self.seq_len

    def reshards_after_forward(self, n: int) -> bool:
        """Whether FSDP gathers each block again for its backward (see reshard_after_forward)."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.degrees(n).pp <= 1

    def fp8_gather_active(self, n: int) -> bool:
        d = self.degrees(n)
        gathers = d.dp_shard > 1 if d.dp_mode in ("fsdp", "hsdp") else self.distributed_optimizer and d.dp_mode == "ddp"
        return self.precision == "fp8-tensorwise" and self.fp8_all_gather and gathers


@dataclass(frozen=True)
class UnitBytes:
    """Bytes per FSDP unit as one TP rank holds it: gathered parameters, and gradients reduced."""

    block_gather: float
    root_gather: float
    block_grad: float
    root_grad: float
    root_flops_share: float  # output layer's share of the step's FLOPs (not overlapped per block)


@lru_cache(maxsize=4096)
def unit_bytes(w: Workload, n: int) -> UnitBytes:
    """A pipeline stage is given the root unit that only the first and last stages hold (the slowest stage)."""
    s = dataclasses.replace(w.model_shape(), num_layers=w.stage_layers(n))
    d, kv = s.dim, s.num_kv_heads * s.head_dim
    linear = 2 * d * d + 2 * d * kv + 3 * d * s.ffn_hidden_dim  # wq, wo, wk, wv, w1, w2, w3
    norms = 2 * d
    root = 2 * s.vocab_size * d + d  # embedding, output, final norm
    tp = w.degrees(n).tp
    param_bytes = 4 if w.precision == "fp32" else 2
    linear_bytes = 1 if w.fp8_gather_active(n) else param_bytes
    g = w.grad_reduce_bytes
    block_grad, root_grad = (linear / tp + norms) * g, root / tp * g
    if w.distributed_optimizer and w.degrees(n).dp_mode == "ddp":
        # its reduce-scatter of the gradients and all-gather of the parameters, charged as one all-reduce: an
        # all-reduce of S puts on each link what a reduce-scatter and an all-gather of S do, so S is their mean
        block_grad = (linear / tp * (g + linear_bytes) + norms * (g + param_bytes)) / 2
        root_grad = root / tp * (g + param_bytes) / 2
    return UnitBytes(
        block_gather=(linear * linear_bytes / tp + norms * param_bytes),
        root_gather=root * param_bytes / tp,
        block_grad=block_grad,
        root_grad=root_grad,
        root_flops_share=6 * s.vocab_size * d / s.flops_per_token(w.seq_len),
    )


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n standard normal draws], Blom (1958): Phi^-1((n - 0.375) / (n + 0.25)); 0 for n = 1."""
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


EULER_GAMMA = 0.5772156649015329


@lru_cache(maxsize=1024)
def expected_max_exponential(n: int) -> float:
    """E[max of n exponential draws] less the mean, in standard deviations: the harmonic number H_n - 1 (exact
    sum up to 64, then ln n + gamma + 1/2n - 1/12n^2, accurate to 1e-8); 0 for n = 1."""
    if n <= 64:
        return sum(1.0 / k for k in range(2, n + 1))
    return math.log(n) + EULER_GAMMA + 1 / (2 * n) - 1 / (12 * n * n) - 1.0


def straggler_z(net: Network, n: int) -> float:
    """How far the slowest of n devices lies behind the mean, in standard deviations of device speed: an
    exponential tail (a few slow devices; grows as ln n) or a normal one (grows as sqrt(2 ln n))."""
    return expected_max_exponential(n) if net.straggler_tail == "exponential" else expected_max_normal(n)


# -------------------------------------------------------------------------------------------- groups


def groups(w: Workload, n: int, gpus_per_node: int) -> dict[str, Group]:
    """Placement of the communicators at N: TP innermost (contiguous ranks), then CP, then shard, then replicate,
    pipeline stages outermost (Megatron's order). A context-parallel rank holds its own gradients of the same
    parameters, so the gradient and parameter traffic of FSDP (or DDP) spans the CP ranks too. `gpus_per_node` is
    the NVLink domain: a rack-scale domain (GB200 NVL72) counts as one node."""
    d = w.degrees(n)
    tp_local = min(d.tp, gpus_per_node)
    cp_local = max(1, min(d.cp, gpus_per_node // tp_local))
    sharded = d.dp_mode in ("fsdp", "hsdp")
    shard_size = d.dp_shard * (d.cp if sharded else 1)
    rep_size = d.dp_replicate * (1 if sharded else d.cp)
    shard_local = max(1, min(shard_size, gpus_per_node // tp_local))
    rep_local = max(1, min(rep_size, gpus_per_node // (tp_local * shard_local)))
    return {
        "tp": Group(d.tp, tp_local),
        "cp": Group(d.cp, cp_local),
        "shard": Group(shard_size, shard_local),
        "replicate": Group(rep_size, rep_local),
    }


@dataclass(frozen=True)
class Collectives:
    """Per-call cost (ms) of each collective a step issues."""

    ag_block: float = 0.0
    ag_root: float = 0.0
    rs_block: float = 0.0  # includes the HSDP replica all-reduce of the shard
    rs_root: float = 0.0
    ar_block: float = 0.0  # DDP bucket
    ar_root: float = 0.0
    tp_per_block: float = 0.0  # all TP collectives of one block, forward + backward (+ recompute)
    cp_fwd_block: float = 0.0  # CP's exchange of keys and values of one block's forward (overlapped with attention)
    cp_bwd_block: float = 0.0  # and of its backward (keys and values again, and their gradients)
    p2p_ms: float = 0.0  # one stage-to-stage send of a micro-batch's activation
    dp_bus_gb_per_s: float = 0.0
    dp_bound: str = "none"


@lru_cache(maxsize=4096)  # a calibration asks for the same (workload, network, N) many times
def collectives(w: Workload, net: Network, n: int, gpus_per_node: int) -> Collectives:
    gpus_per_node = net.nvlink_domain_gpus or gpus_per_node
    d, g, b = w.degrees(n), groups(w, n, gpus_per_node), unit_bytes(w, n)
    k = w.blocks_per_unit(n)  # a bucket of k blocks travels as one collective
    b = dataclasses.replace(b, block_gather=k * b.block_gather, block_grad=k * b.block_grad)
    ms = 1e-3
    out: dict[str, float | str] = {}
    shard, rep = g["shard"], g["replicate"]
    if d.dp_mode in ("fsdp", "hsdp") and shard.size > 1:
        ag = all_gather(net, shard, b.block_gather)
        out |= {
            "ag_block": ag.time_us * ms,
            "ag_root": all_gather(net, shard, b.root_gather).time_us * ms,
            "dp_bus_gb_per_s": ag.bus_gb_per_s,
            "dp_bound": ag.bound,
        }
        rs_b, rs_r = reduce_scatter(net, shard, b.block_grad), reduce_scatter(net, shard, b.root_grad)
        ar_b, ar_r = all_reduce(net, rep, b.block_grad / shard.size), all_reduce(net, rep, b.root_grad / shard.size)
        out |= {"rs_block": (rs_b.time_us + ar_b.time_us) * ms, "rs_root": (rs_r.time_us + ar_r.time_us) * ms}
        if rep.size > 1 and ar_b.bound == "inter-node":
            out |= {"dp_bound": "inter-node"}
    elif d.dp_mode in ("ddp", "hsdp", "none") and rep.size > 1:
        ar = all_reduce(net, rep, b.block_grad)
        out |= {
            "ar_block": ar.time_us * ms,
            "ar_root": all_reduce(net, rep, b.root_grad).time_us * ms,
            "dp_bus_gb_per_s": ar.bus_gb_per_s,
            "dp_bound": ar.bound,
        }
    if d.tp > 1:
        out["tp_per_block"] = _tp_block_ms(w, net, n, g["tp"])
    if d.cp > 1:  # per block; step_time adds the k blocks of a unit
        s = w.model_shape()
        act_bytes = 4 if w.precision == "fp32" else 2
        # keys and values of the whole sequence, as one TP rank holds them (heads sharded by TP)
        kv_bytes = w.sequences_per_dp_rank(n) * w.seq_len * 2 * s.num_kv_heads * s.head_dim * act_bytes / d.tp
        kv = all_gather(net, g["cp"], kv_bytes).time_us * ms
        passes = 2 if w.activation_checkpointing == "full" else 1  # the recomputed forward exchanges them again
        out |= {"cp_fwd_block": kv, "cp_bwd_block": (passes - 1) * kv + 2 * kv}
    if d.pp > 1:
        s = w.model_shape()
        act_bytes = 4 if w.precision == "fp32" else 2
        activation = w.pipeline_micro_batch() * w.seq_len / d.cp * s.dim * act_bytes / d.tp  # sequence parallel
        stage_devices = n // d.pp
        out["p2p_ms"] = point_to_point(net, stage_devices < gpus_per_node, activation).time_us * ms
    return Collectives(**out)  # type: ignore[arg-type]


def _tp_block_ms(w: Workload, net: Network, n: int, tp: Group) -> float:
    s = w.model_shape()
    activation = w.sequences_per_dp_rank(n) * w.seq_len / w.degrees(n).cp * s.dim  # one full activation
    gather_bytes = 1 if w.precision == "fp8-tensorwise" else (4 if w.precision == "fp32" else 2)
    act_bytes = 4 if w.precision == "fp32" else 2
    ag: Cost = all_gather(net, tp, activation * gather_bytes)
    rs: Cost = reduce_scatter(net, tp, activation * act_bytes)
    passes = 3 if w.activation_checkpointing == "full" else 2  # forward, backward (, recomputed forward)
    # backward mirrors forward: the gathers' gradients are reduce-scattered and vice versa (in bf16)
    fwd = 2 * ag.time_us + 2 * rs.time_us
    bwd = 4 * rs.time_us
    return ((passes - 1) * fwd + bwd) * 1e-3


# ---------------------------------------------------------------------------------------------- step


@dataclass(frozen=True)
class StepParts:
    step_ms: float
    compute_ms: float  # the mean device's compute, CP's attention cost included (before the wait for the slowest)
    straggler_ms: float  # waiting for the slowest of N devices
    communication_ms: float  # every collective of the step, end to end
    exposed_communication_ms: float
    hidden_communication_ms: float
    interference_ms: float  # compute slowed by collectives running beside it
    tp_communication_ms: float  # exposed TP collectives (part of exposed_communication_ms)
    optimizer_ms: float
    idle_ms: float  # idle time measured at N0, the pipeline bubble, and a faster stage's wait for the slowest
    dp_bus_gb_per_s: float
    dp_bound: str


def _layer(comm_ms: float, work_ms: float, f: float) -> tuple[float, float, float]:
    """(time, exposed comm, interference) of one block's compute with a collective beside it."""
    if work_ms + f * comm_ms >= comm_ms:
        return work_ms + f * comm_ms, 0.0, f * comm_ms
    return comm_ms, comm_ms - work_ms, 0.0


def step_time(
    w: Workload,
    net: Network,
    n: int,
    gpus_per_node: int,
    compute_ms: float,
    *,
    optimizer_ms: float = 0.0,
    idle_ms: float = 0.0,
) -> StepParts:
    """Step at N for a mean-device compute of compute_ms (per device, everything but optimizer and idle)."""
    c = collectives(w, net, n, gpus_per_node)
    straggle = 1 + net.device_speed_cv * straggler_z(net, n)
    # context parallel's attention costs more than its FLOP share (part of the compute); a pipelined step runs at
    # its slowest stage, and the mean device idles for the rest (idle_ms)
    compute_ms = compute_ms * w.cp_compute_factor(n)
    stage_factor = w.stage_compute_factor(n)
    work = compute_ms * straggle * stage_factor
    imbalance_ms = compute_ms * straggle * (stage_factor - 1) if stage_factor > 1 else 0.0
    k = w.blocks_per_unit(n)
    num_layers = math.ceil(w.stage_layers(n) / k)  # data-parallel units: blocks, or buckets of k blocks
    share = unit_bytes(w, n).root_flops_share
    root_ms = work * share
    fwd_share = 0.25 if w.activation_checkpointing == "full" else FWD_SHARE  # recompute runs in backward
    # products, not differences: a huge compute (1e308 ms) gives inf, never inf - inf
    wf = work * (1 - share) * fwd_share / num_layers
    wb = work * (1 - share) * (1 - fwd_share) / num_layers
    f = net.collective_sm_fraction
    # A stage's m micro-batches: the data-parallel collectives run once a step, beside the first micro-batch's forward
    # (gathers) and the last one's backward (reductions), or exposed after them (dp_overlap); CP's exchange runs
    # beside every micro-batch's attention. (count, comm beside it, compute) of the blocks of one micro-batch:
    m = w.micro_batches(n)
    mode = w.dp_overlap_mode(n)
    wf, wb = wf / m, wb / m
    reduce_ms = c.ar_block or c.rs_block
    gather = c.ag_block if mode != "none" else 0.0  # beside forward's (and a re-gathering backward's) blocks
    red = reduce_ms if mode == "overlapped" else 0.0
    regather = bool(c.ag_block) and w.reshards_after_forward(n)
    # An interleaved schedule (v model chunks a stage, overlapped), as Megatron-Core's interleaved 1F1B launches the
    # chunks' collectives (param_sync_func, grad_sync_func): chunk c's gathers (2 <= c < v) start at chunk c-1's
    # first micro-batch and run beside its forward of P micro-batches; chunk c's reductions (c >= 1) start after its
    # last backward and run beside chunk c-1's backward of P micro-batches. Chunks 0 and 1 gather on demand, and
    # chunk 0 reduces last: they keep the one micro-batch window. wide_g / wide_r units get `win` micro-batches.
    win = min(w.degrees(n).pp, int(m)) if w.interleaved_windows(n) and not regather else 1
    v = max(1, w.virtual_stages)
    wide_g = max(0, num_layers - math.ceil(2 * num_layers / v)) if win > 1 else 0
    wide_r = num_layers - math.ceil(num_layers / v) if win > 1 else 0
    cf, cb = k * c.cp_fwd_block / m, k * c.cp_bwd_block / m  # per micro-batch
    bwd: list[tuple[float, float, float, float]]  # (count, comm, compute, micro-batches it spans)
    if regather:
        # FSDP/HSDP: block L-1 prefetches L-2's gather; blocks L-2..1 also reduce L+1; block 0 only reduces
        bwd = (
            [(1, gather, wb, 1), (num_layers - 2, gather + red, wb, 1), (1, red, wb, 1)]
            if num_layers > 1
            else [(1, 0.0, wb, 1)]
        )
    else:  # DDP (or none), or FSDP kept gathered: block i's backward hides block i+1's reduction
        bwd = [(1, 0.0, wb, 1), (num_layers - 1 - wide_r, red, wb, 1), (wide_r, red, wb * win, win)]
    # the other micro-batches: compute alone, or beside CP's exchange, which runs beside each block's attention
    fwd: list[tuple[float, float, float, float]] = [
        (num_layers - 1 - wide_g, gather, wf, 1),
        (wide_g, gather, wf * win, win),
        (1, 0.0, wf, 1),
        ((m - 1) * num_layers - wide_g * (win - 1), 0.0, wf, 1),
    ]
    bwd.append(((m - 1) * num_layers - wide_r * (win - 1), 0.0, wb, 1))
    blocks = [(q, x + cf * u, y) for q, x, y, u in fwd] + [(q, x + cb * u, y) for q, x, y, u in bwd]
    # the first gathers and last reductions, and the pipeline's fill and drain sends (forward and backward); what
    # dp_overlap does not put beside compute is exposed
    p2p_ms = 2 * (w.degrees(n).pp - 1) * c.p2p_ms
    head_tail = c.ag_root + c.ag_block + c.rs_root + c.ar_root + reduce_ms + p2p_ms
    if mode != "overlapped":
        head_tail += (num_layers - 1) * reduce_ms
    if mode == "none":  # forward's other gathers, and a re-gathering backward's
        head_tail += (num_layers - 1) * c.ag_block * (2 if regather else 1)
    tp_ms = c.tp_per_block * w.stage_layers(n)
    blocks = [b for b in blocks if b[0] > 0]  # 0 x inf would be nan (one- and two-layer models)
    layers = [(k, *_layer(x, y, f)) for k, x, y in blocks]
    exposed = head_tail + tp_ms + sum(k * e for k, _, e, _ in layers)
    total_comm = head_tail + tp_ms + sum(k * x for k, x, _ in blocks)
    # summed in the order of `exposed` (each layer's time >= its exposed part), so step >= exposed after rounding
    # a pipelined step also waits out the bubble (1 + (P - 1) / (v m)), counted as idle time of the stage
    stage_ms = head_tail + tp_ms + sum(k * t for k, t, _, _ in layers) + root_ms
    bubble = w.bubble(n)
    bubble_ms = stage_ms * (bubble - 1) if bubble > 1 else 0.0  # never inf x 0
    step = stage_ms + bubble_ms + optimizer_ms + idle_ms
    return StepParts(
        step_ms=step,
        compute_ms=compute_ms,
        straggler_ms=compute_ms * (straggle - 1),
        communication_ms=total_comm,
        exposed_communication_ms=exposed,
        hidden_communication_ms=total_comm - exposed,
        interference_ms=sum(k * i for k, _, _, i in layers),
        tp_communication_ms=tp_ms,
        optimizer_ms=optimizer_ms,
        idle_ms=idle_ms + bubble_ms + imbalance_ms,
        dp_bus_gb_per_s=c.dp_bus_gb_per_s,
        dp_bound=c.dp_bound,
    )


def solve_compute(target_ms: float, step_of: Callable[[float], float]) -> float:
    """The compute_ms whose modelled time step_of(compute_ms) is target_ms. step_of is increasing and piecewise
    linear with slope >= 1, so secant steps from c = target converge in a few calls; bisection guards them."""
    if step_of(0.0) >= target_ms:
        return 0.0
    lo, hi = 0.0, target_ms
    c, fc = target_ms, step_of(target_ms)
    for _ in range(50):
        if abs(fc - target_ms) <= 1e-9 * target_ms:
            return c
        lo, hi = (c, hi) if fc < target_ms else (lo, c)
        c_next = c - (fc - target_ms)  # slope ~ 1: compute adds to the step one for one where it is not hidden
        c = c_next if lo < c_next < hi else lo + (hi - lo) / 2  # (lo + hi) / 2 overflows near 1e308
        fc = step_of(c)
    return min(max(c, 0.0), target_ms)
