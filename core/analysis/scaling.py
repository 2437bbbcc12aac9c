"""Linear-scaling curves from run results (pure; computed on read). Definitions: docs/architecture.md.

Input: plain `RunPoint` records (one per run, repeats included). Output: a `ScalingReport` the API returns
as JSON directly. Per series (engine, model + layers, precision, layout, scaling mode, cluster) and device
count N:

- X(N): median over succeeded repeats of global tokens/s; spread = (max - min) / median.
- E(N) = X(N) / (X(N0) * N / N0), N0 the smallest measured N of the series (or the baseline asked for).
- S(N) = X_fp8(N) / X_bf16(N) for the same engine, model, layout, scaling mode, cluster and N.
- engine ratio R(N) = X_engine(N) / X_scalebench(N) for the same model, precision, layout, scaling mode, cluster
  and N: another stack (TorchTitan, the user's own command) against this service's runner.
- Amdahl and USL fits on >= 3 measured points, with fit quality. The fits describe the measured range only:
  their value at the cluster's full size is given only when that N lies within it (a curve fit, not a
  prediction); beyond it the one prediction is the projection (core.projection, GET
  /experiments/{id}/projection) with its 80% interval, and the series' notes say so.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from core.analysis.fits import MIN_FIT_POINTS, AmdahlParams, FitRefused, USLParams, fit_amdahl, fit_usl
from core.analysis.numerics import Curves, LossVerdict, loss_verdict
from core.analysis.time_to_loss import TimeToLoss, match_losses, price
from core.contracts.base import Frozen
from core.contracts.specs import FP8_PRECISIONS, resolve_layout

NOISY_SPREAD = 0.05  # a point whose repeats spread more than 5% of their median is flagged noisy
PointStatus = Literal["measured", "failed", "pending", "missing"]


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One run (one repeat of one matrix point), as the DB or an import gives it."""

    run_id: str | int
    model: str
    num_layers: int
    precision: str
    layout: str
    scaling: str  # weak | strong
    cluster: str
    num_devices: int
    status: str  # succeeded | failed | anything else (queued, running, ...) counts as pending
    tokens_per_sec: float | None = None  # global
    step_ms_median: float | None = None
    mfu_vs_bf16_peak: float | None = None
    mfu_vs_precision_peak: float | None = None
    peak_memory_allocated_gib: float | None = None
    final_loss: float | None = None
    imported: bool = False
    engine: str = "scalebench"


class SeriesKey(Frozen):
    engine: str = "scalebench"
    model: str
    num_layers: int
    precision: str
    layout: str
    scaling: str
    cluster: str

    def label(self) -> str:
        engine = "" if self.engine == "scalebench" else f"[{self.engine}] "
        return f"{engine}{self.model}/L{self.num_layers} {self.precision} {self.layout} {self.scaling} @{self.cluster}"


class ScalingPoint(Frozen):
    num_devices: int
    status: PointStatus
    flags: list[str] = []  # noisy, failed, some_failed, missing, pending, imported, invalid_value
    num_succeeded: int = 0
    num_failed: int = 0
    num_pending: int = 0
    run_ids: list[str] = []
    tokens_per_sec: float | None = None  # X(N), global, median over repeats
    tokens_per_sec_min: float | None = None
    tokens_per_sec_max: float | None = None
    tokens_per_sec_per_device: float | None = None
    spread: float | None = None  # (max - min) / median, a fraction
    efficiency: float | None = None  # E(N), a fraction
    fp8_speedup: float | None = None  # S(N); fp8 series only
    engine_ratio: float | None = None  # R(N) = X_engine / X_scalebench; series of another engine only
    step_ms_median: float | None = None
    mfu_vs_bf16_peak: float | None = None
    mfu_vs_precision_peak: float | None = None
    peak_memory_allocated_gib: float | None = None
    final_loss: float | None = None


class FitValue(Frozen):
    """A fitted curve's value at an N within the series' measured range (never outside it)."""

    num_devices: int
    tokens_per_sec: float = Field(description="The fitted curve's X(N), global tokens/s.")
    efficiency: float | None = Field(description="The fitted curve's X(N) against the measured X(N0) (a fraction).")
    note: str


AT_FULL_SIZE = Field(
    None,
    description=(
        "The fitted curve's X and E at the cluster's full size (or full_size) when that N lies within the measured "
        "range; null outside it (the fits describe the measured range only: beyond it the projection, GET "
        "/experiments/{id}/projection, gives E(N) with its 80% interval, and the series' notes say so) or "
        "when not fitted."
    ),
)


class AmdahlFit(Frozen):
    fitted: bool
    reason: str | None = None  # why not fitted
    tokens_per_sec_one_device: float | None = None  # X1
    serial_fraction: float | None = None  # s
    max_speedup: float | None = None  # 1 / s (None when s = 0)
    r_squared: float | None = None
    rms_rel_error: float | None = None
    num_points: int = 0
    at_full_size: FitValue | None = AT_FULL_SIZE


class USLFit(Frozen):
    fitted: bool
    reason: str | None = None
    lambda_tokens_per_sec: float | None = None  # one-device throughput
    sigma: float | None = None  # contention
    kappa: float | None = None  # coherency
    r_squared: float | None = None
    rms_rel_error: float | None = None
    num_points: int = 0
    peak_num_devices: float | None = Field(
        None,
        description=(
            "N* = sqrt((1 - sigma) / kappa), where the fitted curve peaks, when it lies within the measured range; "
            "null outside it (see peak_in_measured_range) or when kappa <= 0 (no peak)."
        ),
    )
    peak_tokens_per_sec: float | None = Field(None, description="The fitted curve's X(N*); null with peak_num_devices.")
    peak_in_measured_range: bool | None = Field(
        None,
        description=(
            "true: the fitted curve peaks within the measured range (peak_num_devices); false: it would peak outside "
            "it, which the fit does not describe (no peak given); null: kappa <= 0, no peak."
        ),
    )
    at_full_size: FitValue | None = AT_FULL_SIZE


class Series(Frozen):
    key: SeriesKey
    baseline_num_devices: int | None  # N0 used for E(N)
    points: list[ScalingPoint]
    amdahl: AmdahlFit
    usl: USLFit
    notes: list[str] = []


class SpeedupPoint(Frozen):
    engine: str = "scalebench"
    model: str
    num_layers: int
    layout: str
    scaling: str
    cluster: str
    precision: str  # the fp8 recipe
    num_devices: int
    fp8_tokens_per_sec: float
    bf16_tokens_per_sec: float
    speedup: float
    fp8_final_loss: float | None = None
    bf16_final_loss: float | None = None
    loss_rel_gap: float | None = None  # (fp8 - bf16) / bf16 final loss
    # Does fp8 loss track bf16 (core.analysis.numerics): the window gap, its noise band, the verdict and why; None when
    # the report was built without loss curves. loss_numerics: the whole verdict (window, slopes, source, seeds).
    loss_verdict: str | None = None  # tracks | differs | inconclusive
    loss_gap: float | None = None  # (fp8 - bf16) / bf16 mean loss over the window, mean over seeds
    loss_gap_band: float | None = None  # half-width of the noise band of loss_gap
    loss_verdict_reason: str | None = None
    loss_numerics: LossVerdict | None = None
    # Time to the same loss (core.analysis.time_to_loss): fp8 steps / bf16 steps to reach bf16's end loss (> 1: fp8
    # needs more), and the speedup that survives it, S(N) / steps_ratio, each with a band from the seeds; None
    # with the reason in time_to_loss (e.g. fp8 never reached bf16's loss: time_to_loss.shortfall says by how much).
    steps_ratio: float | None = Field(
        None,
        description="fp8 steps / bf16 steps to reach the loss bf16 reached at the end of its run (> 1: fp8 needs more)",
    )
    steps_ratio_band: float | None = Field(None, description="Half-width of steps_ratio's band (seeds and step noise).")
    effective_speedup: float | None = Field(
        None, description="speedup / steps_ratio: the throughput speedup at equal loss; null: see time_to_loss.reason"
    )
    effective_speedup_band: float | None = Field(None, description="Half-width of effective_speedup's band.")
    time_to_loss: TimeToLoss | None = Field(
        None,
        description="Time to the same loss: targets, steps, tokens and seconds to them, matched points, shortfall.",
    )


class EngineRatioPoint(SeriesKey):
    """R(N) = X_engine(N) / X_scalebench(N) at the same model, precision, layout, scaling, cluster and N; the key
    is the other engine's series."""

    engine: str  # the other engine: torchtitan, command:<name>
    num_devices: int
    tokens_per_sec: float  # the engine's X(N)
    scalebench_tokens_per_sec: float
    ratio: float


class ScalingReport(Frozen):
    series: list[Series]
    speedups: list[SpeedupPoint]
    engine_ratios: list[EngineRatioPoint] = []
    gpu_counts: list[int]  # every N seen in the input
    noisy_spread: float = NOISY_SPREAD
    baseline_num_devices: int | None = None  # as asked; None: each series' smallest measured N


# ------------------------------------------------------------------------------------------ points


def _finite(value: float | None) -> float | None:
    """A stored value that is not a finite number (inf, NaN) reads as absent."""
    return value if value is not None and math.isfinite(value) else None


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in map(_finite, values) if v is not None]
    return statistics.median(vals) if vals else None


def _usable_throughput(r: RunPoint) -> bool:
    """A throughput a curve can use: finite and positive (a bad stored value makes the point `invalid_value`)."""
    return r.tokens_per_sec is not None and math.isfinite(r.tokens_per_sec) and r.tokens_per_sec > 0


@dataclass(frozen=True, slots=True)
class PointValues:
    """The part of a point that comes from its succeeded runs' summaries: how many have a usable throughput, and
    the min, max and medians of their values (None values left out)."""

    num_succeeded: int = 0
    num_invalid: int = 0  # succeeded runs whose stored throughput is not finite and positive (counted as failed)
    tokens_per_sec: float | None = None  # X(N), median
    tokens_per_sec_min: float | None = None
    tokens_per_sec_max: float | None = None
    step_ms_median: float | None = None
    mfu_vs_bf16_peak: float | None = None
    mfu_vs_precision_peak: float | None = None
    peak_memory_allocated_gib: float | None = None
    final_loss: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PointRuns(PointValues):
    """What one point (series, N) needs from its runs: counts, run ids, and its PointValues. `aggregate_points`
    builds them from RunPoints; the database builds the same records with GROUP BY (db.points), so a report
    never needs one row per run."""

    key: SeriesKey
    num_devices: int
    num_failed: int
    num_pending: int
    run_ids: tuple[str, ...]  # in run order
    imported: bool  # any run of the point was imported


def _point_runs(key: SeriesKey, num_devices: int, runs: Sequence[RunPoint]) -> PointRuns:
    succeeded = [r for r in runs if r.status == "succeeded" and r.tokens_per_sec is not None]
    ok = [r for r in succeeded if _usable_throughput(r)]
    num_invalid = len(succeeded) - len(ok)  # counted as failed: nothing usable was measured
    num_failed = sum(r.status == "failed" for r in runs) + num_invalid
    xs = [r.tokens_per_sec for r in ok if r.tokens_per_sec is not None]
    return PointRuns(
        key=key,
        num_devices=num_devices,
        num_succeeded=len(ok),
        num_failed=num_failed,
        num_invalid=num_invalid,
        num_pending=len(runs) - len(ok) - num_failed,
        run_ids=tuple(str(r.run_id) for r in runs),
        imported=any(r.imported for r in runs),
        tokens_per_sec=_median(xs),
        tokens_per_sec_min=min(xs) if xs else None,
        tokens_per_sec_max=max(xs) if xs else None,
        step_ms_median=_median(r.step_ms_median for r in ok),
        mfu_vs_bf16_peak=_median(r.mfu_vs_bf16_peak for r in ok),
        mfu_vs_precision_peak=_median(r.mfu_vs_precision_peak for r in ok),
        peak_memory_allocated_gib=_median(r.peak_memory_allocated_gib for r in ok),
        final_loss=_median(r.final_loss for r in ok),
    )


def aggregate_points(runs: Iterable[RunPoint]) -> list[PointRuns]:
    """One PointRuns per (series, N), series in order of their first run, N in order of first appearance."""
    groups: dict[tuple[SeriesKey, int], list[RunPoint]] = {}
    keys: dict[tuple[str, str, int, str, str, str, str], SeriesKey] = {}
    for r in runs:
        raw = (r.engine, r.model, r.num_layers, r.precision, r.layout, r.scaling, r.cluster)
        key = keys.get(raw) or keys.setdefault(raw, _key(r))
        groups.setdefault((key, r.num_devices), []).append(r)
    return [_point_runs(key, n, rs) for (key, n), rs in groups.items()]


def _point(p: PointRuns, noisy_spread: float) -> dict[str, Any]:
    """The fields of a ScalingPoint (efficiency and fp8 speedup are added by the series)."""
    base = dict(
        num_devices=p.num_devices,
        num_succeeded=p.num_succeeded,
        num_failed=p.num_failed,
        num_pending=p.num_pending,
        run_ids=list(p.run_ids),
    )
    imported = ["imported"] if p.imported else []
    invalid = ["invalid_value"] if p.num_invalid else []
    if not p.num_succeeded:
        status: PointStatus = "failed" if p.num_failed and not p.num_pending else "pending"
        return dict(status=status, flags=[status] + invalid + imported, **base)
    x, x_min, x_max = p.tokens_per_sec, p.tokens_per_sec_min, p.tokens_per_sec_max
    # a succeeded run counts only with a usable throughput, so the point has its median, min and max
    assert x is not None and x_min is not None and x_max is not None
    spread = _finite((x_max - x_min) / x) if x > 0 else None
    flags = ["noisy"] if spread is not None and spread > noisy_spread else []
    flags += ["some_failed"] if p.num_failed else []
    flags += ["pending"] if p.num_pending else []
    return dict(
        status="measured",
        flags=flags + invalid + imported,
        tokens_per_sec=x,
        tokens_per_sec_min=p.tokens_per_sec_min,
        tokens_per_sec_max=p.tokens_per_sec_max,
        tokens_per_sec_per_device=x / p.num_devices,
        spread=spread,
        step_ms_median=p.step_ms_median,
        mfu_vs_bf16_peak=p.mfu_vs_bf16_peak,
        mfu_vs_precision_peak=p.mfu_vs_precision_peak,
        peak_memory_allocated_gib=p.peak_memory_allocated_gib,
        final_loss=p.final_loss,
        **base,
    )


def _layout_fits(layout: str, num_devices: int) -> bool:
    try:
        resolve_layout(layout, num_devices)
    except ValueError:
        return False
    return True


def _points(
    by_n: Mapping[int, PointRuns], layout: str, all_counts: Sequence[int], noisy_spread: float
) -> tuple[list[dict[str, Any]], list[int]]:
    """Points of one series (as ScalingPoint fields), with missing ones for counts measured elsewhere; also
    the counts the layout cannot use."""
    points: list[dict[str, Any]] = []
    impossible: list[int] = []
    for n in all_counts:
        if n in by_n:
            points.append(_point(by_n[n], noisy_spread))
        elif _layout_fits(layout, n):
            points.append(dict(num_devices=n, status="missing", flags=["missing"]))
        else:
            impossible.append(n)
    return points, impossible


def _with_efficiency(points: list[dict[str, Any]], baseline_n: int | None) -> tuple[int | None, list[str]]:
    """E(N) = X(N) / (X(N0) * N / N0), set on the points. An asked-for N0 that this series did not measure
    gives no E, and says so."""
    measured = {p["num_devices"]: p["tokens_per_sec"] for p in points if p.get("tokens_per_sec")}
    if not measured:
        return None, []
    n0 = baseline_n if baseline_n is not None else min(measured)
    if n0 not in measured:
        return None, [f"no efficiency: baseline N0={n0} was not measured in this series"]
    x0 = measured[n0]
    for p in points:
        if p.get("tokens_per_sec"):
            p["efficiency"] = p["tokens_per_sec"] / (x0 * p["num_devices"] / n0)
    return n0, []


# -------------------------------------------------------------------------------------------- fits


def _in_range(num_devices: float, measured: Mapping[int, float]) -> bool:
    return min(measured) <= num_devices <= max(measured)


def _fit_value(
    predict: Callable[[float], float], num_devices: int | None, measured: Mapping[int, float], n0: int | None
) -> FitValue | None:
    """The fitted curve's X and E at `num_devices`; None without a size, outside the measured range (the fits
    describe that range only: beyond it the projection predicts), or where X leaves the float range."""
    if num_devices is None or not _in_range(num_devices, measured):
        return None
    x = _finite(predict(num_devices))
    if x is None:
        return None
    # ratio first: no overflow
    eff = _finite((x / measured[n0]) * (n0 / num_devices)) if n0 is not None and n0 in measured else None
    note = f"curve fit at N={num_devices}, within the measured range {min(measured)}..{max(measured)}"
    return FitValue(num_devices=num_devices, tokens_per_sec=x, efficiency=eff, note=note)


def beyond_range_note(num_devices: int, measured: Mapping[int, float]) -> str:
    """The series' note when the full size lies outside its measured range: the fits give nothing there."""
    lo, hi = min(measured), max(measured)
    return (
        f"N={num_devices} is outside the measured range {lo}..{hi}: the Amdahl/USL fits describe the measured range "
        f"only; beyond it the projection gives E(N) with its 80% interval (GET /experiments/{{id}}/projection)"
    )


# Fitted parameters depend on nothing but the series' measured points (N, X(N)) in order: that tuple is the
# series' own fingerprint, so a run that changes one series refits that series only, and a new N0 or full
# size reuses the fit (only the cheap curve value is redone). Bounded: one entry is a few hundred bytes.
FIT_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=FIT_CACHE_SIZE)
def _amdahl_params(points: tuple[tuple[int, float], ...]) -> AmdahlParams | FitRefused:
    return fit_amdahl([n for n, _ in points], [x for _, x in points])


@functools.lru_cache(maxsize=FIT_CACHE_SIZE)
def _usl_params(points: tuple[tuple[int, float], ...]) -> USLParams | FitRefused:
    return fit_usl([n for n, _ in points], [x for _, x in points])


def _fit_amdahl(measured: Mapping[int, float], full_n: int | None, n0: int | None) -> AmdahlFit:
    if len(measured) < MIN_FIT_POINTS:
        return AmdahlFit(
            fitted=False,
            reason=f"not fitted: fewer than {MIN_FIT_POINTS} points ({len(measured)} measured)",
            num_points=len(measured),
        )
    p = _amdahl_params(tuple(measured.items()))
    if isinstance(p, FitRefused):  # the fits are total: a refusal carries its reason, never an exception
        return AmdahlFit(fitted=False, reason=p.reason, num_points=len(measured))
    q = p.quality
    return AmdahlFit(
        fitted=True,
        tokens_per_sec_one_device=p.tokens_per_sec_one_device,
        serial_fraction=p.serial_fraction,
        max_speedup=1 / p.serial_fraction if p.serial_fraction > 0 else None,
        r_squared=q.r_squared,
        rms_rel_error=q.rms_rel_error,
        num_points=q.num_points,
        at_full_size=_fit_value(p.predict, full_n, measured, n0),
    )


def _fit_usl(measured: Mapping[int, float], full_n: int | None, n0: int | None) -> USLFit:
    if len(measured) < MIN_FIT_POINTS:
        return USLFit(
            fitted=False,
            reason=f"not fitted: fewer than {MIN_FIT_POINTS} points ({len(measured)} measured)",
            num_points=len(measured),
        )
    p = _usl_params(tuple(measured.items()))
    if isinstance(p, FitRefused):
        return USLFit(fitted=False, reason=p.reason, num_points=len(measured))
    q, peak = p.quality, p.peak_num_devices
    peak_in_range = _in_range(peak, measured) if peak else None
    return USLFit(
        fitted=True,
        lambda_tokens_per_sec=p.lambda_tokens_per_sec,
        sigma=p.sigma,
        kappa=p.kappa,
        r_squared=q.r_squared,
        rms_rel_error=q.rms_rel_error,
        num_points=q.num_points,
        peak_num_devices=peak if peak_in_range else None,
        peak_tokens_per_sec=_finite(p.predict(peak)) if peak and peak_in_range else None,
        peak_in_measured_range=peak_in_range,
        at_full_size=_fit_value(p.predict, full_n, measured, n0),
    )


# ---------------------------------------------------------------------------------------- assembly


def _key(r: RunPoint) -> SeriesKey:
    return SeriesKey(
        engine=r.engine,
        model=r.model,
        num_layers=r.num_layers,
        precision=r.precision,
        layout=r.layout,
        scaling=r.scaling,
        cluster=r.cluster,
    )


def _pair_key(k: SeriesKey) -> tuple[str, str, int, str, str, str]:
    """What an fp8 series shares with the bf16 series it is compared with (S(N) stays within one engine)."""
    return (k.engine, k.model, k.num_layers, k.layout, k.scaling, k.cluster)


def _point_key(k: SeriesKey, num_devices: int) -> tuple[str, str, int, str, str, str, str, int]:
    return (k.engine, k.model, k.num_layers, k.precision, k.layout, k.scaling, k.cluster, num_devices)


def _engine_ratios(groups: Mapping[SeriesKey, list[dict[str, Any]]]) -> list[EngineRatioPoint]:
    """R(N) of every point of a series of another engine against the scalebench point of the same key and N."""
    ours = {
        _point_key(k, p["num_devices"]): p.get("tokens_per_sec")
        for k, pts in groups.items()
        if k.engine == "scalebench"
        for p in pts
    }
    out = []
    for k, pts in groups.items():
        if k.engine == "scalebench":
            continue
        for p in pts:
            x = p.get("tokens_per_sec")
            ref = ours.get(_point_key(k.model_copy(update={"engine": "scalebench"}), p["num_devices"]))
            if x and ref and (ratio := _finite(x / ref)) is not None:
                out.append(
                    EngineRatioPoint(
                        **k.model_dump(),
                        num_devices=p["num_devices"],
                        tokens_per_sec=x,
                        scalebench_tokens_per_sec=ref,
                        ratio=ratio,
                    )
                )
    return out


NumericsKey = tuple[tuple[str, ...], int, tuple[str, ...], int]  # run ids and pending count of fp8, then of bf16
# What a numerics cache holds: a pair's verdict and matched losses by its NumericsKey, and the SpeedupPoint fields
# they give priced with the points' values by ("priced", NumericsKey, speedup, the values) (_verdict_fields).
NumericsCache = MutableMapping[tuple[Any, ...], tuple[LossVerdict, TimeToLoss] | dict[str, Any]]


def numerics_key(fp8: PointRuns | Mapping[str, Any], bf16: PointRuns | Mapping[str, Any]) -> NumericsKey:
    """What a pair's verdict and matched losses depend on: the run ids of both points and how many are still
    pending (a succeeded run's curve never changes; a run that ends changes the pending count)."""

    def part(p: PointRuns | Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
        if isinstance(p, PointRuns):
            return (p.run_ids, p.num_pending)
        return (tuple(p.get("run_ids", ())), p.get("num_pending", 0))

    return (*part(fp8), *part(bf16))


def loss_pairs(points: Iterable[PointRuns]) -> list[tuple[PointRuns, PointRuns]]:
    """Every measured fp8 point with the measured bf16 point it is compared with (same engine, model, layout,
    scaling, cluster, N): the pairs whose curves a report compares (those that get a SpeedupPoint)."""
    pts = [p for p in points if p.num_succeeded and p.tokens_per_sec]
    bf16 = {(*_pair_key(p.key), p.num_devices): p for p in pts if p.key.precision == "bf16"}
    out = []
    for p in pts:
        if p.key.precision in FP8_PRECISIONS and (b := bf16.get((*_pair_key(p.key), p.num_devices))) is not None:
            out.append((p, b))
    return out


def pair_numerics(fp8_runs: Sequence[Curves], bf16_runs: Sequence[Curves]) -> tuple[LossVerdict, TimeToLoss]:
    """The curve-dependent part of a pair's numerics: its loss verdict and matched losses (not priced)."""
    return loss_verdict(fp8_runs, bf16_runs), match_losses(fp8_runs, bf16_runs)


def _tokens_per_step(p: Mapping[str, Any]) -> float | None:
    x, ms = p.get("tokens_per_sec"), p.get("step_ms_median")
    return x * ms / 1000 if x and ms else None


def _verdict_fields(
    p: dict[str, Any],
    b: dict[str, Any],
    speedup: float,
    run_losses: Mapping[str, Curves] | None,
    cache: NumericsCache | None,
) -> dict[str, Any]:
    """The loss verdict and time to loss of an fp8 point against its bf16 twin, from the cache (numerics_key; and
    priced, by the points' values too) or their runs' curves (neither: no verdict)."""
    key = numerics_key(p, b)
    fp8_ms, bf16_ms = p.get("step_ms_median"), b.get("step_ms_median")
    priced_key = ("priced", key, speedup, fp8_ms, bf16_ms, p.get("tokens_per_sec"), b.get("tokens_per_sec"))
    if cache is not None and isinstance(cached := cache.get(priced_key), dict):  # a priced key holds fields
        return cached
    found = cache.get(key) if cache is not None else None
    if not isinstance(found, tuple):  # not cached (a NumericsKey holds a verdict and matched losses)
        if run_losses is None:
            return {}
        found = pair_numerics(
            [run_losses[i] for i in p.get("run_ids", []) if i in run_losses],
            [run_losses[i] for i in b.get("run_ids", []) if i in run_losses],
        )
        if cache is not None:
            cache[key] = found
    v, matched = found
    t = price(
        matched,
        speedup=speedup,
        fp8_step_ms=fp8_ms,
        bf16_step_ms=bf16_ms,
        fp8_tokens_per_step=_tokens_per_step(p),
        bf16_tokens_per_step=_tokens_per_step(b),
    )
    fields = dict(
        loss_verdict=v.verdict,
        loss_gap=v.gap,
        loss_gap_band=v.band,
        loss_verdict_reason=v.reason,
        loss_numerics=v,
        steps_ratio=t.steps_ratio,
        steps_ratio_band=t.steps_ratio_band,
        effective_speedup=t.effective_speedup,
        effective_speedup_band=t.effective_speedup_band,
        time_to_loss=t,
    )
    if cache is not None:  # priced by the points' values: the same values give the same fields
        cache[priced_key] = fields
    return fields


def _speedups(
    groups: Mapping[SeriesKey, list[dict[str, Any]]],
    run_losses: Mapping[str, Curves] | None = None,
    cache: NumericsCache | None = None,
) -> list[SpeedupPoint]:
    """S(N) of every fp8 point against the bf16 point of its pair series; points as ScalingPoint fields.
    run_losses (run id -> its curves): each pair also gets its loss verdict."""
    bf16 = {_pair_key(k): {p["num_devices"]: p for p in pts} for k, pts in groups.items() if k.precision == "bf16"}
    out = []
    for k, pts in groups.items():
        ref = bf16.get(_pair_key(k)) if k.precision in FP8_PRECISIONS else None
        if not ref:
            continue
        for p in pts:
            b = ref.get(p["num_devices"])
            x, loss = p.get("tokens_per_sec"), p.get("final_loss")
            if x and b is not None and b.get("tokens_per_sec"):
                bx, b_loss = b["tokens_per_sec"], b.get("final_loss")
                gap = (loss - b_loss) / b_loss if loss is not None and b_loss else None
                out.append(
                    SpeedupPoint(
                        engine=k.engine,
                        model=k.model,
                        num_layers=k.num_layers,
                        layout=k.layout,
                        scaling=k.scaling,
                        cluster=k.cluster,
                        precision=k.precision,
                        num_devices=p["num_devices"],
                        fp8_tokens_per_sec=x,
                        bf16_tokens_per_sec=bx,
                        speedup=x / bx,
                        fp8_final_loss=loss,
                        bf16_final_loss=b_loss,
                        loss_rel_gap=gap,
                        **_verdict_fields(p, b, x / bx, run_losses, cache),
                    )
                )
    return out


def _series(
    key: SeriesKey, points: list[dict[str, Any]], impossible: list[int], baseline_n: int | None, full_n: int | None
) -> Series:
    n0, notes = _with_efficiency(points, baseline_n)
    measured = {p["num_devices"]: p["tokens_per_sec"] for p in points if p.get("tokens_per_sec")}
    if impossible:
        notes.append(f"layout {key.layout} cannot run at N={', '.join(map(str, impossible))}: not a missing point")
    if key.scaling == "weak" and len(measured) >= MIN_FIT_POINTS:
        notes.append(
            "Amdahl's form fitted to weak scaling: s is the share of step time that does not "
            "parallelize at fixed local batch (Gustafson's reading), not a strong-scaling limit"
        )
    amdahl, usl = _fit_amdahl(measured, full_n, n0), _fit_usl(measured, full_n, n0)
    if full_n is not None and (amdahl.fitted or usl.fitted) and not _in_range(full_n, measured):
        notes.append(beyond_range_note(full_n, measured))
    return Series(
        key=key,
        baseline_num_devices=n0,
        points=[ScalingPoint(**p) for p in points],
        amdahl=amdahl,
        usl=usl,
        notes=notes,
    )


def build_report(
    runs: Iterable[RunPoint],
    *,
    baseline_num_devices: int | None = None,
    full_size_by_cluster: Mapping[str, int] | None = None,
    noisy_spread: float = NOISY_SPREAD,
    run_losses: Mapping[str, Curves] | None = None,
) -> ScalingReport:
    """Scaling report of the runs of one experiment (or several to compare).

    baseline_num_devices: N0 for E(N) (e.g. 8 for one node); None takes each series' smallest measured N.
    full_size_by_cluster: devices of each cluster at full size; the fits give their curve's X and E there
    when it lies within a series' measured range, else nothing (the series' notes point to the projection).
    """
    return build_report_from_points(
        aggregate_points(runs),
        baseline_num_devices=baseline_num_devices,
        full_size_by_cluster=full_size_by_cluster,
        noisy_spread=noisy_spread,
        run_losses=run_losses,
    )


def build_report_from_points(
    points: Iterable[PointRuns],
    *,
    baseline_num_devices: int | None = None,
    full_size_by_cluster: Mapping[str, int] | None = None,
    noisy_spread: float = NOISY_SPREAD,
    run_losses: Mapping[str, Curves] | None = None,
    numerics_cache: NumericsCache | None = None,
) -> ScalingReport:
    """build_report over points already aggregated (aggregate_points, or the database's GROUP BY): one
    PointRuns per (series, N), series in order of their first run. run_losses: run id (str) -> its loss curves
    or their digests (db.points.load_run_digests), for the fp8 loss verdicts and time to loss; None: none.
    numerics_cache: each pair's verdict and matched losses by numerics_key, read first and filled (then
    run_losses needs only the runs of the pairs missing from it: loss_pairs)."""
    by_key: dict[SeriesKey, dict[int, PointRuns]] = {}
    for p in points:
        by_key.setdefault(p.key, {})[p.num_devices] = p
    all_counts = sorted({n for by_n in by_key.values() for n in by_n})
    sized = {k: _points(by_n, k.layout, all_counts, noisy_spread) for k, by_n in by_key.items()}
    groups = {k: pts for k, (pts, _) in sized.items()}
    speedups = _speedups(groups, run_losses, numerics_cache)
    engine_ratios = _engine_ratios(groups)
    s_of = {
        (
            sp.engine,
            sp.model,
            sp.num_layers,
            sp.precision,
            sp.layout,
            sp.scaling,
            sp.cluster,
            sp.num_devices,
        ): sp.speedup
        for sp in speedups
    }
    r_of = {
        (r.engine, r.model, r.num_layers, r.precision, r.layout, r.scaling, r.cluster, r.num_devices): r.ratio
        for r in engine_ratios
    }
    series = []

    def order(k: SeriesKey) -> tuple[str, int, str, str, bool, str, str, str]:
        return (
            k.model,
            k.num_layers,
            k.cluster,
            k.scaling,
            k.engine != "scalebench",
            k.engine,
            k.layout,
            k.precision,
        )

    for k in sorted(sized, key=order):
        pts, impossible = sized[k]
        for fields in pts:
            fields["fp8_speedup"] = s_of.get(_point_key(k, fields["num_devices"]))
            fields["engine_ratio"] = r_of.get(_point_key(k, fields["num_devices"]))
        full_n = (full_size_by_cluster or {}).get(k.cluster)
        series.append(_series(k, pts, impossible, baseline_num_devices, full_n))
    return ScalingReport(
        series=series,
        speedups=speedups,
        engine_ratios=engine_ratios,
        gpu_counts=all_counts,
        noisy_spread=noisy_spread,
        baseline_num_devices=baseline_num_devices,
    )


# --------------------------------------------------------------------------------------------- CSV

CSV_COLUMNS = (
    "engine",
    "model",
    "num_layers",
    "precision",
    "layout",
    "scaling",
    "cluster",
    "num_devices",
    "status",
    "tokens_per_sec",
    "tokens_per_sec_per_device",
    "efficiency",
    "fp8_speedup",
    "engine_ratio",
    "mfu_vs_bf16_peak",
    "mfu_vs_precision_peak",
    "peak_memory_allocated_gib",
    "spread",
    "num_succeeded",
    "num_failed",
    "flags",
    "loss_verdict",  # fp8 points: core.analysis.numerics (empty for bf16 and without curves)
    "loss_gap",
    "loss_gap_band",
    "loss_verdict_reason",
    "steps_ratio",  # fp8 points: core.analysis.time_to_loss (fp8 steps / bf16 steps to bf16's end loss)
    "steps_ratio_band",
    "effective_speedup",  # fp8_speedup / steps_ratio
    "effective_speedup_band",
    "time_to_loss_reason",
)
_SPEEDUP_CSV = (
    "loss_verdict",
    "loss_gap",
    "loss_gap_band",
    "loss_verdict_reason",
    "steps_ratio",
    "steps_ratio_band",
    "effective_speedup",
    "effective_speedup_band",
)


def to_csv_rows(report: ScalingReport) -> list[dict[str, object]]:
    """One row per series point, keys in CSV_COLUMNS order; flags joined with ';'."""
    rows = []
    verdicts = {
        (sp.engine, sp.model, sp.num_layers, sp.precision, sp.layout, sp.scaling, sp.cluster, sp.num_devices): sp
        for sp in report.speedups
    }
    for s in report.series:
        for p in s.points:
            row = {**s.key.model_dump(), **p.model_dump(exclude={"flags", "run_ids"})}
            row["flags"] = ";".join(p.flags)
            sp = verdicts.get(_point_key(s.key, p.num_devices))
            for c in _SPEEDUP_CSV:
                row[c] = getattr(sp, c) if sp is not None else None
            ttl = sp.time_to_loss if sp is not None else None
            row["time_to_loss_reason"] = ttl.reason if ttl is not None else None
            rows.append({c: row[c] for c in CSV_COLUMNS})
    return rows


def _csv_value(value: object) -> object:
    """A number that is not finite is written as an empty cell, as JSON writes it null (never `inf`)."""
    return "" if isinstance(value, float) and not math.isfinite(value) else value


def to_csv(report: ScalingReport) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: _csv_value(v) for c, v in row.items()} for row in to_csv_rows(report))
    return buf.getvalue()
