"""Projected scaling curves from measured points (pure): X(N), E(N), S(N) at device counts not measured.

For each series of a scaling report (core.analysis.scaling): take its smallest measured N (N0), find the per-device
compute time there, then model the step at every asked N (core.projection.step_model: compute + the collectives the
layout needs, minus what overlap hides, on the cluster's network, core.projection.network).

- Compute at N0: with a step breakdown (the run result's `breakdown.median`, ms per step), the compute share
  (step_ms - exposed_communication_ms - idle_ms) / step_ms of the step, less the model's own slow-down of
  overlapped compute; without one, the compute for which the model reproduces the measured step time.
- Weak scaling keeps the compute per device; strong scaling divides it by dp(N) / dp(N0).
- Projected E(N) = X(N) / (X(N0) N / N0) on the projected curve; S(N) = X_fp8(N) / X_bf16(N), both projected.
- Where a point was also measured, both are given, with the error (projected - measured) / measured.
- Calibration (optional): fit the inter-node efficiency and the device speed spread to the series' measured
  points beyond N0 (only the spread with one such point), and report the fit's error before and after.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from core.analysis.scaling import ScalingReport, Series, SeriesKey
from core.catalog.shapes import COMPILED_OUTPUT_SCALE
from core.contracts.base import Frozen
from core.contracts.specs import FP8_PRECISIONS, check_layout, model_parallel_size, rank_degrees
from core.contracts.stacks import StackValue
from core.projection.constants import (
    COLLECTIVE_UNITS,
    CP_ATTENTION_COST,
    DEVICE_SPEED_CV,
    INTERVAL_EXPONENT,
    INTERVAL_FAMILY_COVERAGE,
    INTERVAL_NESTED_COVERAGE,
    INTERVAL_Q_PP,
    INTERVAL_SOURCE_MEAN_COVERAGE,
    INTERVAL_VALIDATED_DOUBLINGS,
    STRAGGLER_TAIL,
    VALIDATED_MAX_DEVICES,
    VALIDATED_SERIES,
    VALIDATED_SOURCES,
    VALIDATION_MEAN_MISS_PP,
)
from core.projection.network import Network
from core.projection.stack import describe_stacks, series_stack, stack_note, stack_summaries
from core.projection.step_model import StepParts, Workload, solve_compute, step_time

BREAKDOWN_KEYS = (
    "step_ms",
    "communication_ms",
    "exposed_communication_ms",
    "overlapped_communication_ms",
    "idle_ms",
    "gemm_bf16_ms",
    "gemm_fp8_ms",
    "fp8_cast_ms",
    "attention_ms",
    "elementwise_ms",
    "optimizer_ms",
)

ASSUMPTIONS = (
    "collective cost: alpha-beta model of NCCL/RCCL with the algorithm NCCL's tuning model (src/graph/tuning.cc) "
    "would pick: ring or, with one GPU per node on NVIDIA platforms, PAT (log-depth across nodes) for all-gather "
    "and reduce-scatter; the faster of ring and tree for all-reduce; latencies from that tuning model",
    "pipeline parallel (pp=P+): the scalebench runner's split of the blocks, weighed by time (FLOPs; the output "
    f"layer's x{COMPILED_OUTPUT_SCALE:g} with compiled blocks, fp8-tensorwise's on one H100): the last stage, "
    "which also runs the output layer and the loss, takes fewer; the step runs at the slowest stage (its work over "
    "the mean device's; the other stages' wait is idle time) and waits out the 1F1B bubble 1 + (P - 1) / "
    "(virtual stages x micro-batches), micro-batches of one sequence and one virtual stage (the runner's "
    "schedule) unless the stack sets them, plus the fill and drain sends between stages; context parallel "
    "(cp=C+): each block exchanges the keys and values of its sequence over the C ranks beside its attention, "
    "gradients sync over DP x CP, and a rank's attention takes "
    + ", ".join(f"{f:g}x at C = {c}" for c, f in CP_ATTENTION_COST.items())
    + " its FLOP share (measured on the runner's all-gather attention, one H100, 8,192 tokens; log-linear in C "
    "elsewhere), charged on the causal attention's share of the step's FLOPs",
    "a layout projected from another layout's measured series (layouts=...; the plan's default pp=2, pp=4, pp=8 "
    "and cp=2 forms) keeps the measured per-token compute of N0 and the measured global batch (a weak-scaling "
    "series' sequences per data-parallel rank scaled by pp x cp x tp); its E(N) is against that measured X(N0)",
    "a ring crossing nodes uses one channel per NIC (rail-aligned): bus bandwidth = min(intra-node per GPU x "
    "efficiency, NIC per GPU x efficiency x ranks of the group per node)",
    "FSDP/HSDP: per-block units plus a root unit (embedding, output, final norm); forward gathers all, "
    "backward all but the last block and the root (none under pp, whose stages keep their blocks gathered); "
    "gradients reduce-scattered in fp32; one-block prefetch",
    "data-parallel collectives run once a step, beside one micro-batch's compute: gathers beside the first "
    "micro-batch's forward, reductions beside the last one's backward, or, under pp, after it and exposed "
    "(torch.distributed.pipelining's REDUCE_GRAD, as the runner and TorchTitan run it); a stack with virtual "
    "stages and overlapped collectives runs a model chunk's beside P micro-batches of another chunk "
    "(Megatron-Core's interleaved 1F1B)",
    "fp8 all-gather (fp8-tensorwise with fp8_all_gather): block linear weights gathered in 1 byte; norms and "
    "root in bf16; the small amax all-reduce of the scales is not modelled",
    "DDP: one fp32 all-reduce bucket per block and one for the root; TP: sequence-parallel collectives on the "
    "critical path (no async TP), activations gathered in fp8 with fp8-tensorwise",
    "forward : backward compute = 1 : 2 (1 : 3 with full activation checkpointing); the output layer's "
    "compute (6 V d FLOPs per token) runs outside the per-block overlap",
    "overlapped compute runs slower by collective_sm_fraction while a collective occupies compute units: "
    f"{COLLECTIVE_UNITS:g} of the device's SMs or CUs by default (fitted on published results; 0: no slow-down), "
    "or a cluster network's collective_sm_fraction",
    "a step waits for the slowest of N devices: compute x (1 + device_speed_cv x z(N)), z(N) = H_N - 1 for an "
    "exponential tail of device speeds (straggler_tail), E[max of N normals] for a normal one; "
    f"the {STRAGGLER_TAIL} tail and device_speed_cv {DEVICE_SPEED_CV:g} by default (fitted on published results)",
    "without a breakdown the optimizer step is part of the compute and does not shrink with sharding; with "
    "one, optimizer_ms shrinks with the shard count and idle_ms is carried unchanged",
    "constants (collective share, intra- and inter-node link efficiency, device spread) fitted to "
    f"{VALIDATED_SERIES} published series of {VALIDATED_SOURCES} sources, both vendors; out of sample (each source "
    f"left out) the projected E(N) missed by {VALIDATION_MEAN_MISS_PP} pp on average over series "
    "(bench/projection_validation.py)",
    f"80% interval: E +- {INTERVAL_Q_PP} pp x d ** {INTERVAL_EXPONENT:g}, d = log2(N / N0), up to "
    f"d = {INTERVAL_VALIDATED_DOUBLINGS:g} doublings and x sqrt(d / {INTERVAL_VALIDATED_DOUBLINGS:g}) past them "
    f"(from the out-of-sample misses; {INTERVAL_NESTED_COVERAGE:.0%} of the published points fell inside it when "
    f"each source was left out, {INTERVAL_SOURCE_MEAN_COVERAGE:.0%} of a source's points on average: the sources "
    "with many points fit best, and a cluster unlike the published ones may fall outside it more often; checked up "
    f"to N = {VALIDATED_MAX_DEVICES})",
)


# What a calibration may move, and within which bounds.
FIT_RANGES = {"inter_node_efficiency": (0.05, 1.0), "device_speed_cv": (0.0, 0.1)}


class ProjectedPoint(Frozen):
    num_devices: int
    status: Literal["projected"] = "projected"
    tokens_per_sec: float  # projected X(N), global
    tokens_per_sec_per_device: float
    efficiency: float  # projected E(N) against the projected X(N0)
    fp8_speedup: float | None = None  # projected S(N); fp8 series with a bf16 partner
    step_ms: float
    compute_ms: float
    straggler_ms: float
    communication_ms: float
    exposed_communication_ms: float
    hidden_communication_ms: float
    interference_ms: float
    tp_communication_ms: float
    optimizer_ms: float
    idle_ms: float
    dp_bus_gb_per_s: float
    dp_bound: str  # none | intra-node | inter-node
    beyond_cluster: bool = False  # N above the cluster's configured size
    # 80% prediction interval (interval_half_width around E, X scaled alike)
    efficiency_low: float | None = None
    efficiency_high: float | None = None
    tokens_per_sec_low: float | None = None
    tokens_per_sec_high: float | None = None
    beyond_validated: bool = False  # N above the largest N the model was checked against (VALIDATED_MAX_DEVICES)
    note: str | None = None  # why a point looks odd (E above 100%, beyond the validated range)
    measured_tokens_per_sec: float | None = None
    measured_efficiency: float | None = None
    error: float | None = None  # (projected - measured) / measured X(N)
    efficiency_error_pp: float | None = None  # projected - measured E(N), percentage points


class Calibration(Frozen):
    fitted: bool
    reason: str | None = None
    parameters: dict[str, float] = {}
    num_points: int = 0  # measured points beyond N0 fitted
    rms_rel_error_before: float | None = None
    rms_rel_error_after: float | None = None
    max_abs_rel_error_after: float | None = None


class ProjectedSeries(Frozen):
    key: SeriesKey
    baseline_num_devices: int | None
    baseline_tokens_per_sec: float | None  # measured X(N0)
    compute_source: str  # breakdown | fitted to the measured step
    compute_ms: float | None  # per device at N0, the mean device, before waiting for the slowest
    points: list[ProjectedPoint]
    calibration: Calibration | None = None
    notes: list[str] = []
    cannot_run: dict[int, str] = {}  # N of the asked counts the layout cannot lay the model out at: why


class NetworkUsed(Frozen):
    cluster: str
    source: str  # where the description came from
    gpus_per_node: int
    max_devices: int | None
    inter_node_gb_per_s: float  # per GPU per direction (its NICs)
    network: Network


class ProjectionReport(Frozen):
    network: NetworkUsed
    gpu_counts: list[int]
    assumptions: list[str]
    # one line per stack charged (which series, whose stack), the first assumptions without their details
    stacks: list[str] = []
    series: list[ProjectedSeries]


# ------------------------------------------------------------------------------------------- series


def _unfit_reason(w: Workload, n: int) -> str | None:
    """Why the layout cannot lay the model out at N (its degrees do not exist at N, a pipeline stage would hold no
    block, tensor parallelism would split a head), or None."""
    if n % (span := model_parallel_size(w.layout)):  # one reason for every such N, so notes group them
        return f"N not a multiple of the {span} devices a data-parallel rank spans"
    try:
        degrees = w.degrees(n)
        w.sequences_per_dp_rank(n)
    except (ValueError, AssertionError) as exc:
        return str(exc) or f"no {w.layout} degrees at N={n}"
    shape = w.model_shape()
    if degrees.pp > shape.num_layers:
        return f"pp={degrees.pp} stages, more than the model's {shape.num_layers} blocks"
    return shape.tp_reason(degrees.tp)


def _fits(w: Workload, n: int) -> bool:
    return _unfit_reason(w, n) is None


class _Model:
    """One series' model: its workload and network, and the compute found at N0."""

    def __init__(
        self,
        w: Workload,
        net: Network,
        gpus_per_node: int,
        n0: int,
        step0_ms: float,
        breakdown: Mapping[str, float] | None,
    ):
        self.w, self.net, self.gpn, self.n0 = w, net, gpus_per_node, n0
        self.step0_ms, self.breakdown = step0_ms, breakdown
        bd = breakdown or {}
        # The breakdown's ms come from the profiled steps; scale them to the measured step time at N0.
        has_breakdown = float(bd.get("step_ms") or 0.0) > 0
        scale = step0_ms / bd["step_ms"] if has_breakdown else 0.0
        self.idle_ms = float(bd.get("idle_ms") or 0.0) * scale
        self.optimizer0_ms = float(bd.get("optimizer_ms") or 0.0) * scale
        if has_breakdown:
            exposed_ms = float(bd.get("exposed_communication_ms") or 0.0) * scale
            target = step0_ms - exposed_ms - self.idle_ms - self.optimizer0_ms  # compute share x step, less optimizer

            def with_interference(c: float) -> float:
                p = self.parts(n0, c, optimizer_ms=0.0, idle_ms=0.0)
                return p.compute_ms + p.interference_ms  # the waits for slower devices show as exposed comm

            self.source = "breakdown"
            self.compute0_ms = solve_compute(target, with_interference)
        else:
            self.source = "fitted to the measured step"
            self.compute0_ms = solve_compute(step0_ms, lambda c: self.parts(n0, c).step_ms)

    def parts(self, n: int, compute0_ms: float | None = None, **fixed: float) -> StepParts:
        c0 = compute_ms_scale(self.w, self.n0, n) * (self.compute0_ms if compute0_ms is None else compute0_ms)
        opt = fixed.get("optimizer_ms", self.optimizer0_ms * _shard_ratio(self.w, self.n0, n))
        idle = fixed.get("idle_ms", self.idle_ms)
        return step_time(self.w, self.net, n, self.gpn, c0, optimizer_ms=opt, idle_ms=idle)

    def tokens_per_sec(self, n: int) -> float:
        return self.w.tokens_per_step(n) / self.parts(n).step_ms * 1e3


class _Relaid:
    """A measured series' model laid out anew: the per-token compute found at N0 under the measured layout, spent
    under `layout` (another tp, pp, cp or data-parallel form) at every N, at the measured global batch: a weak-scaling
    series' sequences per data-parallel rank scale with the devices a rank spans (pp x cp x tp), so both layouts
    take the same tokens per step at every N, and the two are compared at the same optimizer steps, not a pipeline
    of a few sequences against data parallelism. Where that is not a whole number of sequences per rank (a wider
    measured rank: tp=4+fsdp laid out as pp=2+fsdp) it is rounded up, and `batch_note` says so."""

    def __init__(self, base: _Model, layout: str):
        self.base, self.net, self.gpn, self.n0 = base, base.net, base.gpn, base.n0
        w, self.batch_note = base.w, ""
        if w.scaling == "weak" and w.local_batch_size:
            sequences, rest = divmod(w.local_batch_size * model_parallel_size(layout), model_parallel_size(w.layout))
            sequences += 1 if rest else 0
            w = dataclasses.replace(w, local_batch_size=sequences)
            count = f"{sequences} sequence{'' if sequences == 1 else 's'} per data-parallel rank"
            self.batch_note = (
                f", at the measured global batch ({count})"
                if not rest
                else f", at {count} (the measured global batch is not a whole number of sequences per rank: rounded up)"
            )
        self.w = dataclasses.replace(w, layout=layout)
        self.source = f"{base.source}, laid out as {layout}"
        self.compute0_ms = base.compute0_ms
        self.idle_ms, self.optimizer0_ms = base.idle_ms, base.optimizer0_ms
        self._per_token_ms = base.compute0_ms / (base.w.tokens_per_step(base.n0) / base.n0)
        self._params0 = _params_per_device(base.w, base.n0)

    def parts(self, n: int, compute0_ms: float | None = None, **fixed: float) -> StepParts:
        compute_ms = self._per_token_ms * self.w.tokens_per_step(n) / n
        opt = self.optimizer0_ms * _params_per_device(self.w, n) / self._params0
        return step_time(self.w, self.net, n, self.gpn, compute_ms, optimizer_ms=opt, idle_ms=self.idle_ms)


def _params_per_device(w: Workload, n: int) -> float:
    """Share of the model's parameters (and optimizer state) one device holds."""
    d = w.degrees(n)
    shard = d.dp_shard * d.cp if d.dp_mode in ("fsdp", "hsdp") else 1
    return 1.0 / (d.tp * d.pp * shard)


def projected_efficiency(
    w: Workload, net: Network, gpus_per_node: int, n0: int, tokens_per_sec_n0: float, counts: Sequence[int]
) -> dict[int, float]:
    """E(N) = X(N) / (X(N0) N / N0) projected from the one measured X(N0) (global tokens/s), without a breakdown:
    the path project_series takes, without building its report (bench/projection_validation.py calls it
    thousands of times)."""
    step0_ms = w.tokens_per_step(n0) / tokens_per_sec_n0 * 1e3
    return _efficiencies(_Model(w, net, gpus_per_node, n0, step0_ms, None), counts)


def calibrated_efficiency(
    w: Workload, net: Network, gpus_per_node: int, measured: Mapping[int, float], counts: Sequence[int]
) -> tuple[dict[int, float], Calibration]:
    """E(N) projected as project_series does with calibrate=True: from the smallest measured N (N0), after fitting
    the inter-node efficiency and device speed spread to the measured points beyond it (`measured`: N -> global
    tokens/s, N0's included); without a breakdown (bench/calibration_check.py)."""
    n0 = min(measured)
    step0_ms = w.tokens_per_step(n0) / measured[n0] * 1e3
    calibration, model = _calibrate(_Model(w, net, gpus_per_node, n0, step0_ms, None), measured)
    return _efficiencies(model, counts), calibration


def _efficiencies(model: _Model, counts: Sequence[int]) -> dict[int, float]:
    """E(N) against the model's own X(N0) (the measured one: the model passes through N0) at each N it can time."""
    w, n0 = model.w, model.n0
    step0 = model.parts(n0).step_ms
    out = {}
    for n in counts:
        step_ms = model.parts(n).step_ms if _fits(w, n) else 0.0
        if not (0.0 < step_ms < math.inf):
            continue  # a step the model cannot time (a measured step ~0 ms at N0 = 1): no point, never a raise
        eff = (w.tokens_per_step(n) / w.tokens_per_step(n0)) * (step0 / step_ms) * (n0 / n)
        if math.isfinite(eff):
            out[n] = eff
    return out


def interval_half_width(n: int, n0: int) -> float:
    """Half-width of the 80% interval of E(N) (a fraction): INTERVAL_Q_PP x d ** INTERVAL_EXPONENT, d the doublings
    from N0, within the validated span; past it the width grows as the square root of d over the span. 0 at N0."""
    d, span = abs(math.log2(n / n0)), INTERVAL_VALIDATED_DOUBLINGS
    if d == 0:
        return 0.0
    scale = math.pow(d, INTERVAL_EXPONENT) if d <= span else math.pow(span, INTERVAL_EXPONENT) * math.sqrt(d / span)
    return INTERVAL_Q_PP / 100 * scale


_ONE_DOUBLING = interval_half_width(2, 1)

# A projected series' note on its layout family's interval coverage starts so (the plan and the CLI pick it out).
INTERVAL_NOTE_PREFIX = "80% interval: "


def layout_family(layout: str) -> str:
    """The layout family a layout template's interval coverage is reported for: pipelined (with any tp and cp),
    context parallel, or its data-parallel form (hsdp, tp+fsdp, fsdp, ddp)."""
    pp, cp, tp = rank_degrees(layout)
    if pp > 1:
        return "pp (+tp, +cp)"
    if cp > 1:
        return "cp"
    if tp > 1:
        return "tp+fsdp"
    body = check_layout(layout).rsplit("+", 1)[-1]  # fsdp, ddp, hsdp:shard=S (or tp=1)
    return "hsdp" if body.startswith("hsdp") else body


def interval_family_note(layout: str) -> str | None:
    """What the validation says of the interval for this layout's family, where it says less than the pooled
    figure: fewer than 5 published points, or under 75% of them inside with each source left out."""
    family = layout_family(layout)
    inside, total = INTERVAL_FAMILY_COVERAGE.get(family, (0, 0))
    where = f"layout family {family}"
    if total == 0:
        return f"{INTERVAL_NOTE_PREFIX}no published series of the {where} checks it"
    share = f"{inside} of the {total} published points of the {where} ({inside / total:.0%}) fell inside it"
    if total < 5:
        return f"{INTERVAL_NOTE_PREFIX}{share} with each source left out, too few points to say more for these layouts"
    if inside / total < 0.75:
        return f"{INTERVAL_NOTE_PREFIX}{share} with each source left out: for these layouts it covers less than 80%"
    return None


def _point_note(w: Workload, n: int, n0: int, eff: float, optimizer_ms: float, optimizer0_ms: float) -> str | None:
    notes = []
    if eff > 1 + 1e-9:
        if optimizer_ms < optimizer0_ms and w.degrees(n).dp_mode in ("fsdp", "hsdp"):
            notes.append(
                f"E above 100%: the optimizer step is sharded over more devices than at N0={n0} "
                f"({optimizer0_ms:.3g} -> {optimizer_ms:.3g} ms), not an error"
            )
        else:
            notes.append(f"E above 100%: the modelled step per token is shorter than at N0={n0}, not an error")
    if n > VALIDATED_MAX_DEVICES:
        notes.append(f"beyond the largest validated N ({VALIDATED_MAX_DEVICES}): the interval is extrapolated")
    elif abs(math.log2(n / n0)) > INTERVAL_VALIDATED_DOUBLINGS:
        notes.append(
            f"more than {INTERVAL_VALIDATED_DOUBLINGS:g} doublings from N0={n0}, the span the published series "
            "check: the interval widens as assumed (sqrt of the doublings), not as measured"
        )
    return "; ".join(notes) or None


def compute_ms_scale(w: Workload, n0: int, n: int) -> float:
    """Per-device compute at N relative to N0: 1 for weak scaling, tokens per device ratio for strong."""
    return (w.sequences_per_dp_rank(n) / w.sequences_per_dp_rank(n0)) if w.scaling == "strong" else 1.0


def _shard_ratio(w: Workload, n0: int, n: int) -> float:
    d0, d = w.degrees(n0), w.degrees(n)
    return d0.dp_shard / d.dp_shard if d.dp_mode in ("fsdp", "hsdp") else 1.0


def _around(value: float, width: float, bounds: tuple[float, float]) -> tuple[float, float]:
    return max(bounds[0], value - width), min(bounds[1], value + width)


def spans_nodes(measured: Iterable[int], n0: int, gpus_per_node: int) -> bool:
    """Whether a measured N beyond N0 spans more than one node: where calibrate=None (the API's default) fits the
    projection to the measured points. Every cut bench/calibration_check.py scores is such a case; a series
    measured within one node only (1 to 8 GPUs) is projected from N0 unless calibrate=True asks."""
    return any(n > n0 and n > gpus_per_node for n in measured)


def _calibrate(model: _Model, measured: Mapping[int, float]) -> tuple[Calibration, _Model]:
    pts = {n: x for n, x in measured.items() if n != model.n0 and _fits(model.w, n)}
    if not pts:
        return Calibration(fitted=False, reason="needs measured points at 2 or more N (only N0 measured)"), model
    # The inter-node efficiency only where a second measured point crosses nodes (else nothing constrains it).
    crosses = any(n > model.gpn for n in pts)
    names = ("inter_node_efficiency", "device_speed_cv") if len(pts) >= 2 and crosses else ("device_speed_cv",)

    def rms(m: _Model) -> float:
        # Relative errors (the measured X normalises each point), so 1e-300 and 1e300 tokens/s fit alike; a
        # ratio that is not a finite number makes the fit inf (never chosen), not an exception.
        rel = [m.tokens_per_sec(n) / x - 1 for n, x in pts.items()]
        if not all(math.isfinite(r) for r in rel):
            return math.inf
        # hypot scales before squaring: a relative error of 1e160 gives 1e160, not OverflowError from `** 2`
        return math.hypot(*rel) / math.sqrt(len(rel))

    def fit(combo: dict[str, float]) -> tuple[float, _Model]:
        m = _Model(model.w, model.net.model_copy(update=combo), model.gpn, model.n0, model.step0_ms, model.breakdown)
        return rms(m), m

    # A coarse grid over each factor's range, then a finer one around the best (bounds: FIT_RANGES).
    before, ranges = rms(model), {k: FIT_RANGES[k] for k in names}
    if not math.isfinite(before):
        return Calibration(
            fitted=False,
            reason="the measured points beyond N0 and the model differ by more than the float range: nothing to fit",
        ), model
    best = (before, model, {k: getattr(model.net, k) for k in names})  # moved only by a strictly better fit
    # Each round keeps +-2 of its 8 steps around the best, halving the ranges (keeping +-1 step got stuck where the
    # two factors trade off).
    for _ in range(8):
        grids = {k: [lo + (hi - lo) * i / 8 for i in range(9)] for k, (lo, hi) in ranges.items()}
        combos: list[dict[str, float]] = [{}]
        for name in names:
            combos = [c | {name: v} for c in combos for v in grids[name]]
        for combo in combos:
            err, m = fit(combo)
            if err < best[0]:
                best = (err, m, combo)
        ranges = {k: _around(best[2][k], (hi - lo) / 4, FIT_RANGES[k]) for k, (lo, hi) in ranges.items()}
    err, fitted, combo = best
    max_miss = max(abs(fitted.tokens_per_sec(n) / x - 1) for n, x in pts.items())
    worst = max_miss if math.isfinite(max_miss) else None
    return Calibration(
        fitted=True,
        parameters=combo,
        num_points=len(pts),
        rms_rel_error_before=before,
        rms_rel_error_after=err,
        max_abs_rel_error_after=worst,
    ), fitted


def _workload(key: SeriesKey, spec: Mapping[str, Any], stack: Mapping[str, StackValue]) -> Workload:
    return Workload(
        model=key.model,
        num_layers=key.num_layers,
        precision=key.precision,
        layout=key.layout,
        scaling=key.scaling,
        seq_len=int(spec.get("seq_len", 2048)),
        local_batch_size=spec.get("local_batch_size"),
        global_batch_size=spec.get("global_batch_size"),
        fp8_all_gather=bool(spec.get("fp8_all_gather", False)),
        activation_checkpointing=spec.get("activation_checkpointing", "none"),
        compile=bool(spec.get("compile", False)),
        **stack,  # type: ignore[arg-type]
    )


def _refused(series: Series, reason: str, n0: int | None = None, x0: float | None = None) -> ProjectedSeries:
    return ProjectedSeries(
        key=series.key,
        baseline_num_devices=n0,
        baseline_tokens_per_sec=x0,
        compute_source="none",
        compute_ms=None,
        points=[],
        notes=[f"not projected: {reason}"],
    )


def _finite(parts: StepParts) -> bool:
    return all(math.isfinite(v) for v in vars(parts).values() if isinstance(v, float))


def project_series(
    series: Series,
    spec: Mapping[str, Any],
    net: Network,
    gpus_per_node: int,
    gpu_counts: Sequence[int],
    *,
    breakdown: Mapping[str, float] | None = None,
    calibrate: bool | None = False,
    max_devices: int | None = None,
    layout: str | None = None,
    stack: Mapping[str, StackValue] | None = None,
) -> tuple[ProjectedSeries, dict[int, float]]:
    """One series projected at gpu_counts; also {N: projected X} for the fp8 speedups.

    Total: a stored value the model cannot work with (a step time at N0 beyond the float range, a strong-scaling
    series without a global batch) refuses the series with the reason in its notes, and a point whose modelled
    step is not a finite number is left out with a note; nothing raises. E(N) is a ratio of step times and tokens
    per step (normalised by N0), so it does not depend on the size of X(N0).

    With `layout` (another layout template than the series'), the series' per-token compute at N0 is spent under
    that layout at every N: a projected series of that layout (pp / cp layouts included), E against the measured
    X(N0)."""
    measured = {
        p.num_devices: p.tokens_per_sec
        for p in series.points
        if p.tokens_per_sec and math.isfinite(p.tokens_per_sec) and p.tokens_per_sec > 0
    }
    meas_eff = {
        p.num_devices: p.efficiency for p in series.points if p.efficiency is not None and math.isfinite(p.efficiency)
    }
    if not measured:
        return ProjectedSeries(
            key=series.key,
            baseline_num_devices=None,
            baseline_tokens_per_sec=None,
            compute_source="none",
            compute_ms=None,
            points=[],
            notes=["no measured point: nothing to project from"],
        ), {}
    w, n0 = _workload(series.key, spec, stack or {}), min(measured)
    try:
        tokens0 = w.tokens_per_step(n0)
    except (ValueError, AssertionError) as exc:
        return _refused(series, str(exc), n0, measured[n0]), {}
    step0_ms = tokens0 / measured[n0] * 1e3
    if not (math.isfinite(step0_ms) and step0_ms > 0):
        return _refused(
            series,
            f"X(N0={n0}) = {measured[n0]:.3g} tokens/s gives a step time of {step0_ms:.3g} ms, "
            "outside what the model can compute with",
            n0,
            measured[n0],
        ), {}
    model = _Model(w, net, gpus_per_node, n0, step0_ms, breakdown)
    base = model.parts(n0)
    if not _finite(base):
        return _refused(
            series, f"the modelled step at N0={n0} is not a finite number (step {step0_ms:.3g} ms)", n0, measured[n0]
        ), {}
    notes = [note] if (note := stack_note(series.key.engine, stack or {})) else []
    if model.compute0_ms == 0.0 and base.step_ms > step0_ms * (1 + 1e-6):
        notes.append(
            f"the model's communication alone ({base.step_ms:.3g} ms) exceeds the measured step at "
            f"N0={n0} ({step0_ms:.3g} ms): compute taken as 0, the projection does not pass through N0"
        )
    calibration = None
    if calibrate or (calibrate is None and spans_nodes(measured, n0, gpus_per_node)):
        calibration, model = _calibrate(model, measured)
        base = model.parts(n0)
    x0 = w.tokens_per_step(n0) / base.step_ms * 1e3  # the modelled X(N0): the measured one unless calibrated
    baseline_x = measured[n0]
    relaid = layout is not None and layout != w.layout
    timed: _Model | _Relaid = model
    if layout is not None and relaid:
        relaid_model = _Relaid(model, layout)
        timed, w = relaid_model, relaid_model.w
        measured, meas_eff = {}, {}
        notes.append(
            f"projected onto layout {layout} from the measured {series.key.layout} series: the per-token compute "
            f"of N0={n0}, E against its measured X(N0){relaid_model.batch_note}"
        )
        notes.append(
            f"its interval at N0={n0} too is one doubling's width (another layout at the same N: no published "
            "series checks it)"
        )
    counts = sorted(set(gpu_counts) | set(measured))
    unfit = {n: r for n in counts if (r := _unfit_reason(w, n)) is not None}
    skipped = list(unfit)
    points, xs, not_finite = [], {}, []
    for n in (n for n in counts if n not in skipped):
        parts = timed.parts(n)
        if not _finite(parts) or parts.step_ms <= 0:
            not_finite.append(n)
            continue
        # E as a ratio of per-device tokens per ms: independent of the size of X(N0)
        x = w.tokens_per_step(n) / parts.step_ms * 1e3
        eff = (x / n) / (x0 / n0)
        xs[n] = x
        m, me = measured.get(n), meas_eff.get(n)
        # another layout's N0 is a prediction too: one doubling's width at least (no published series checks it)
        half = interval_half_width(n, n0) if not relaid else max(interval_half_width(n, n0), _ONE_DOUBLING)
        low, high = max(0.0, eff - half), eff + half
        error = (x / m - 1) if m else None
        points.append(
            ProjectedPoint(
                efficiency_low=low,
                efficiency_high=high,
                tokens_per_sec_low=x * (low / eff) if eff > 0 else 0.0,
                tokens_per_sec_high=x * (high / eff) if eff > 0 else None,
                beyond_validated=n > VALIDATED_MAX_DEVICES,
                note=_point_note(w, n, n0, eff, parts.optimizer_ms, base.optimizer_ms),
                num_devices=n,
                tokens_per_sec=x,
                tokens_per_sec_per_device=x / n,
                efficiency=eff,
                **{k: v for k, v in vars(parts).items() if k != "compute_ms"},
                compute_ms=parts.compute_ms,
                beyond_cluster=bool(max_devices and n > max_devices),
                measured_tokens_per_sec=m,
                measured_efficiency=me,
                error=error if error is not None and math.isfinite(error) else None,
                efficiency_error_pp=100 * (eff - me) if me is not None else None,
            )
        )
    by_reason: dict[str, list[int]] = {}
    for n, reason in unfit.items():
        by_reason.setdefault(reason, []).append(n)
    notes += [f"layout {w.layout} cannot run at N={', '.join(map(str, ns))} ({r})" for r, ns in by_reason.items()]
    if not_finite:
        notes.append(f"the modelled step is not a finite number at N={', '.join(map(str, not_finite))}: left out")
    if points and (family_note := interval_family_note(w.layout)):
        notes.append(family_note)
    out = ProjectedSeries(
        key=series.key.model_copy(update={"layout": layout}) if relaid else series.key,
        baseline_num_devices=n0,
        baseline_tokens_per_sec=baseline_x,
        compute_source=timed.source,
        compute_ms=timed.compute0_ms,
        points=points,
        calibration=calibration,
        notes=notes,
        cannot_run=unfit,
    )
    return out, xs


def project_report(
    report: ScalingReport,
    spec: Mapping[str, Any],
    net: NetworkUsed,
    gpu_counts: Sequence[int],
    *,
    breakdowns: Mapping[tuple[str, str, int], Mapping[str, float]] | None = None,
    calibrate: bool | None = False,
    layouts: Sequence[str] = (),
    stack: Mapping[str, StackValue] | None = None,
) -> ProjectionReport:
    """Every series of a scaling report projected; breakdowns keyed by (precision, layout, N). `layouts` adds, for
    every measured series, its projection onto each of those layout templates (pp / cp ones included) that the
    experiment did not measure. `stack` describes the measured stack's data-parallel traffic and schedule for every
    series; without it a series is charged its engine's entry of the spec's `stacks`, else the scalebench runner's
    (core.projection.stack). `calibrate`: True fits each series to its measured points beyond N0, False projects
    from N0 alone, None fits the series with a measured point beyond N0 across nodes (spans_nodes)."""
    extra = list(dict.fromkeys(check_layout(t) for t in layouts))
    measured_keys = {s.key for s in report.series}
    out, xs = [], {}
    stacks = spec.get("stacks") or {}
    for s in report.series:
        charged = series_stack(s.key.engine, stack, stacks)
        n0 = min((p.num_devices for p in s.points if p.tokens_per_sec), default=None)
        bd = (breakdowns or {}).get((s.key.precision, s.key.layout, n0)) if n0 else None
        ps, x = project_series(
            s,
            spec,
            net.network,
            net.gpus_per_node,
            gpu_counts,
            breakdown=bd,
            calibrate=calibrate,
            max_devices=net.max_devices,
            stack=charged,
        )
        out.append(ps)
        xs[s.key] = x
        # the other layouts reuse the measured series' fit (the same points and network: the same result)
        calibration = ps.calibration
        fitted_net = net.network.model_copy(update=calibration.parameters) if calibration else net.network
        for layout in extra:
            key = s.key.model_copy(update={"layout": layout})
            if key in measured_keys or any(o.key == key for o in out):
                continue
            ps, x = project_series(
                s,
                spec,
                fitted_net,
                net.gpus_per_node,
                gpu_counts,
                breakdown=bd,
                max_devices=net.max_devices,
                layout=layout,
                stack=charged,
            )
            out.append(ps.model_copy(update={"calibration": calibration}))
            xs[key] = x
    out = [_with_speedups(ps, xs) for ps in out]
    return ProjectionReport(
        network=net,
        gpu_counts=sorted(set(gpu_counts)),
        assumptions=[*describe_stacks(stack, stacks), *ASSUMPTIONS],
        stacks=stack_summaries(stack, stacks),
        series=out,
    )


def _with_speedups(ps: ProjectedSeries, xs: Mapping[SeriesKey, dict[int, float]]) -> ProjectedSeries:
    if ps.key.precision not in FP8_PRECISIONS:
        return ps
    ref = xs.get(ps.key.model_copy(update={"precision": "bf16"}), {})
    pts = [
        p.model_copy(update={"fp8_speedup": p.tokens_per_sec / ref[p.num_devices]}) if p.num_devices in ref else p
        for p in ps.points
    ]
    return ps.model_copy(update={"points": pts})
