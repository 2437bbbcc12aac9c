"""A training plan for a token budget (pure): for every engine x precision x layout and device count N, the time to
train and the GPU-hours, from measured X(N) where the point was measured and from the projection elsewhere.

time_to_train = tokens / X(N); GPU-hours = N x time_to_train. Answers:
- best per N: the fastest option at that N;
- fastest: the fastest option within the GPU cap;
- cheapest_efficient: the fewest GPU-hours (then the fastest) among options whose E(N) >= min_efficiency;
- fastest_efficient: the fastest option whose E(N) >= min_efficiency.
E(N) is each series' own (against its smallest measured N); a measured point carries its measured E.
A projected option carries the projection's 80% interval: E, time and GPU-hours low and high (the time's low
bound from the interval's high throughput); a measured option's bounds are its own values. An option whose
throughput cannot give a time (zero or not finite) is left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from core.analysis.scaling import ScalingReport
from core.contracts.base import Frozen
from core.contracts.specs import check_layout
from core.projection.equal_loss import ratio_for, steps_ratios
from core.projection.model import INTERVAL_NOTE_PREFIX, ProjectionReport

DEFAULT_MIN_EFFICIENCY = 0.9
# The pipeline- and context-parallel forms a plan weighs by default beside each measured layout: projected from the
# measured series' per-token compute (a form the experiment also measured is its own series).
PLAN_LAYOUT_PREFIXES = ("pp=2+", "pp=4+", "pp=8+", "cp=2+")


class PlanOption(Frozen):
    engine: str = "scalebench"
    precision: str
    layout: str
    num_devices: int
    source: Literal["measured", "projected"]
    tokens_per_sec: float  # global X(N)
    tokens_per_sec_per_device: float
    efficiency: float | None
    time_to_train_hours: float
    gpu_hours: float
    cost: float | None = None  # gpu_hours x gpu_hour_cost, when a cost was given
    # 80% interval of a projected option (core.projection.model's); a measured option's bounds are its values
    efficiency_low: float | None = None
    efficiency_high: float | None = None
    time_to_train_hours_low: float | None = None
    time_to_train_hours_high: float | None = None
    gpu_hours_low: float | None = None
    gpu_hours_high: float | None = None
    beyond_validated: bool = False
    beyond_cluster: bool = False  # N above the cluster's configured size (planned on its network all the same)
    note: str | None = None  # why a point looks odd (E above 100%, beyond the validated range)
    # at equal loss (core.projection.equal_loss): fp8 options need steps_ratio x the tokens to reach bf16's loss;
    # bf16 options: their own time; None when no steps_ratio was measured for the recipe
    steps_ratio: float | None = Field(None, description="fp8: measured fp8 steps / bf16 steps to the same loss.")
    time_at_equal_loss_hours: float | None = Field(
        None, description="Hours to reach the loss bf16 reaches with the token budget (fp8: steps_ratio x hours)."
    )
    gpu_hours_at_equal_loss: float | None = Field(None, description="N x time_at_equal_loss_hours.")
    equal_loss_note: str | None = Field(None, description="Where the steps_ratio comes from when not measured at N.")


class PlanRow(Frozen):
    num_devices: int
    best: PlanOption | None  # the fastest option at this N
    options: list[PlanOption]  # fastest first


class Plan(Frozen):
    tokens: float
    max_gpus: int
    min_efficiency: float
    gpu_hour_cost: float | None
    gpu_counts: list[int]
    rows: list[PlanRow]
    fastest: PlanOption | None
    cheapest_efficient: PlanOption | None
    fastest_efficient: PlanOption | None
    notes: list[str] = []


def default_plan_layouts(measured_layouts: Iterable[str]) -> list[str]:
    """The layouts a plan weighs besides the measured ones when none are asked for: each of PLAN_LAYOUT_PREFIXES
    over each measured layout that has no pipeline or context parallelism of its own (fsdp -> pp=2+fsdp, ...,
    cp=2+fsdp)."""
    out = [
        check_layout(prefix + layout)
        for layout in measured_layouts
        if not layout.startswith(("pp=", "cp="))
        for prefix in PLAN_LAYOUT_PREFIXES
    ]
    return list(dict.fromkeys(out))


def plan_counts(measured_counts: Iterable[int], max_gpus: int) -> list[int]:
    """The smallest measured N doubled up to the cap, plus every measured N within it."""
    measured = sorted(set(measured_counts))
    if not measured:
        return []
    counts, n = set(n for n in measured if n <= max_gpus), measured[0]
    while n <= max_gpus:
        counts.add(n)
        n *= 2
    return sorted(counts)


def _hours(tokens: float, x: float | None) -> float | None:
    """tokens / X in hours; None where X is not a positive finite number (or the hours are not finite)."""
    if x is None or not math.isfinite(x) or x <= 0:
        return None
    hours = tokens / x / 3600
    return hours if math.isfinite(hours) else None


def _option(
    engine: str,
    precision: str,
    layout: str,
    n: int,
    source: Literal["measured", "projected"],
    x: float,
    eff: float | None,
    tokens: float,
    gpu_hour_cost: float | None,
    *,
    x_low: float | None = None,
    x_high: float | None = None,
    eff_low: float | None = None,
    eff_high: float | None = None,
    beyond_validated: bool = False,
    beyond_cluster: bool = False,
    note: str | None = None,
) -> PlanOption | None:
    """One option, or None when its throughput cannot give a time (zero, not finite)."""
    hours = _hours(tokens, x)
    if hours is None or not math.isfinite(hours * n):
        return None
    cost = hours * n * gpu_hour_cost if gpu_hour_cost is not None else None
    slow, fast = _hours(tokens, x if x_low is None else x_low), _hours(tokens, x if x_high is None else x_high)
    slow = slow if slow is not None and math.isfinite(slow * n) else None
    fast = fast if fast is not None and math.isfinite(fast * n) else None
    return PlanOption(
        engine=engine,
        precision=precision,
        layout=layout,
        num_devices=n,
        source=source,
        tokens_per_sec=x,
        tokens_per_sec_per_device=x / n,
        efficiency=eff,
        time_to_train_hours=hours,
        gpu_hours=hours * n,
        cost=cost if cost is None or math.isfinite(cost) else None,
        efficiency_low=eff if eff_low is None else eff_low,
        efficiency_high=eff if eff_high is None else eff_high,
        time_to_train_hours_low=fast,
        time_to_train_hours_high=slow,
        gpu_hours_low=None if fast is None else fast * n,
        gpu_hours_high=None if slow is None else slow * n,
        beyond_validated=beyond_validated,
        beyond_cluster=beyond_cluster,
        note=note,
    )


def _no_option(measured: ScalingReport, projected: ProjectionReport, max_gpus: int) -> str:
    """Why a plan has no option at all: nothing measured to project from, or every N above max_gpus."""
    if not any(p.tokens_per_sec for s in measured.series for p in s.points):
        return "no option: no point of the experiment was measured (no run succeeded), so nothing is projected"
    if not projected.series:
        return "no option: no layout of the experiment can be projected on this cluster (the notes say why)"
    return f"no option within max_gpus={max_gpus}: the smallest measured N is larger"


def build_plan(
    measured: ScalingReport,
    projected: ProjectionReport,
    *,
    tokens: float,
    max_gpus: int,
    min_efficiency: float = DEFAULT_MIN_EFFICIENCY,
    gpu_hour_cost: float | None = None,
) -> Plan:
    counts = [n for n in projected.gpu_counts if n <= max_gpus]
    options: list[PlanOption] = []
    dropped: list[str] = []  # options whose throughput gives no finite time (0, a stored value out of range)
    meas = {
        (s.key.engine, s.key.precision, s.key.layout): {p.num_devices: p for p in s.points if p.tokens_per_sec}
        for s in measured.series
    }
    for s in projected.series:
        k = (s.key.engine, s.key.precision, s.key.layout)
        for p in s.points:
            if p.num_devices not in counts:
                continue
            m = meas.get(k, {}).get(p.num_devices)
            if m is not None and m.tokens_per_sec is not None:  # meas holds only points with a throughput
                o = _option(
                    *k,
                    p.num_devices,
                    "measured",
                    m.tokens_per_sec,
                    m.efficiency,
                    tokens,
                    gpu_hour_cost,
                    beyond_cluster=p.beyond_cluster,
                )
            else:
                o = _option(
                    *k,
                    p.num_devices,
                    "projected",
                    p.tokens_per_sec,
                    p.efficiency,
                    tokens,
                    gpu_hour_cost,
                    x_low=p.tokens_per_sec_low,
                    x_high=p.tokens_per_sec_high,
                    eff_low=p.efficiency_low,
                    eff_high=p.efficiency_high,
                    beyond_validated=p.beyond_validated,
                    beyond_cluster=p.beyond_cluster,
                    note=p.note,
                )
            if o is not None:
                options.append(o)
            else:
                dropped.append(f"{k[1]} {k[2]} N={p.num_devices}")
    options = _at_equal_loss(options, measured)
    rows = []
    for n in counts:
        at_n = sorted((o for o in options if o.num_devices == n), key=lambda o: -o.tokens_per_sec)
        rows.append(PlanRow(num_devices=n, best=at_n[0] if at_n else None, options=at_n))
    efficient = [o for o in options if o.efficiency is not None and o.efficiency >= min_efficiency]
    notes = [] if options or dropped else [_no_option(measured, projected, max_gpus)]
    if options and not efficient:
        notes.append(f"no option keeps efficiency >= {min_efficiency:g}")
    if dropped:
        notes.append(f"left out, their throughput gives no finite time or GPU-hours: {', '.join(dropped)}")
    if beyond := sorted({o.num_devices for o in options if o.beyond_cluster}):
        size = projected.network.max_devices
        notes.append(
            f"N={', '.join(map(str, beyond))} exceed cluster {projected.network.cluster!r} ({size} devices): "
            "planned on its network as if it had that many (max_gpus is the cap)"
        )
    # layouts that cannot lay the model out at some of the plan's N, and why (the same for every precision and engine)
    by_reason: dict[tuple[str, str], set[int]] = {}
    for s in projected.series:
        for n, reason in s.cannot_run.items():
            if n in counts:
                by_reason.setdefault((s.key.layout, reason), set()).add(n)
    notes += [
        f"layout {layout} cannot run at N={', '.join(map(str, sorted(ns)))} ({r})"
        for (layout, r), ns in by_reason.items()
    ]
    # where a projected option's layout family was held by the interval less often than it promises
    with_projected = {(o.engine, o.precision, o.layout) for o in options if o.source == "projected"}
    notes += dict.fromkeys(
        n
        for s in projected.series
        if (s.key.engine, s.key.precision, s.key.layout) in with_projected
        for n in s.notes
        if n.startswith(INTERVAL_NOTE_PREFIX)
    )
    # which measured series the projection was fitted to (calibrate), so a reader knows what moved its points
    measured_keys = {m.key for m in measured.series}
    fitted = [
        " ".join(([] if s.key.engine == "scalebench" else [s.key.engine]) + [s.key.precision, s.key.layout])
        for s in projected.series
        if s.calibration is not None and s.calibration.fitted and s.key in measured_keys
    ]
    if fitted:
        notes.append(
            f"projected after fitting to the measured points beyond N0: {', '.join(fitted)} "
            "(calibrate=false, --no-calibrate: from N0 alone)"
        )
    return Plan(
        tokens=tokens,
        max_gpus=max_gpus,
        min_efficiency=min_efficiency,
        gpu_hour_cost=gpu_hour_cost,
        gpu_counts=counts,
        rows=rows,
        notes=notes,
        fastest=max(options, key=lambda o: o.tokens_per_sec, default=None),
        cheapest_efficient=min(efficient, key=lambda o: (o.gpu_hours, -o.tokens_per_sec), default=None),
        fastest_efficient=max(efficient, key=lambda o: o.tokens_per_sec, default=None),
    )


def _at_equal_loss(options: list[PlanOption], measured: ScalingReport) -> list[PlanOption]:
    """The options with their time and GPU-hours at equal loss (core.projection.equal_loss)."""
    ratios = steps_ratios(measured)
    out = []
    for o in options:
        r: float | None
        note: str | None
        if o.precision == "bf16":
            r, note = 1.0, None
        else:
            r, note = ratio_for(ratios, o.engine, o.precision, o.layout, o.num_devices)
        if r is None:
            out.append(o)
            continue
        out.append(
            o.model_copy(
                update=dict(
                    steps_ratio=r if o.precision != "bf16" else None,
                    time_at_equal_loss_hours=o.time_to_train_hours * r,
                    gpu_hours_at_equal_loss=o.gpu_hours * r,
                    equal_loss_note=note,
                )
            )
        )
    return out


_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_token_count(text: str) -> float:
    """'1T', '500B', '2.5e11', '1e12' -> tokens; ValueError naming the allowed forms."""
    raw = text.strip().lower().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(raw[-1:], 1.0) if raw else 1.0
    number = raw[:-1] if raw[-1:] in _SUFFIXES else raw
    try:
        value = float(number) * scale
    except ValueError:
        value = float("nan")
    if not 0 < value < 1e18:
        raise ValueError(
            f"tokens: {text!r} is not a token count; allowed: a positive number below 1e18, "
            "optionally with a suffix K, M, B (or G), T, P, e.g. 1T, 500B, 1e12"
        )
    return value
