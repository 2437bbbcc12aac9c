"""Time to the same loss: how long fp8 takes to reach the loss bf16 reaches (pure; core only).

A recipe's throughput speedup S(N) pays off only if its per-step loss penalty does not eat it. For an fp8
point and its bf16 twin (same engine, seed, data, layout, N), per seed, from the smoothed curves of the runs'
digests (core.analysis.curves; held-out loss when every run has at least MIN_EVAL_POINTS evaluations, else
training loss):

- checkpoints: bf16's run at CHECKPOINTS of its steps (the last one: the end of its run). The target at a
  checkpoint t is the lowest smoothed bf16 loss up to t (the best it reached: an over-fitting held-out curve
  rises at the end), reached by bf16 at step t_bf16 (the first time its smoothed curve reaches it);
- t_fp8: the first step where fp8's smoothed curve reaches the target (linear between smoothed points). When
  fp8 does not get there within its run (a recipe that tracks bf16 falls short by noise alone in about half its
  seeds), the shortfall (fp8's lowest smoothed loss - target) / target is given, and the crossing is
  extrapolated along the straight line through fp8's last quarter in log(step) (still falling), at most
  MAX_EXTRAPOLATION of its steps past its end (`extrapolated`: true; on a curve still flattening in log(step)
  the line gets there early, so the ratio is then a lower bound); beyond that, or on a curve no longer
  falling, there is none;
- steps_ratio_s = t_fp8 / t_bf16 at the end checkpoint (> 1: fp8 needs more steps for the same loss);
- steps_ratio = mean over seeds; band = Z_BAND * sqrt(se_step^2 + se_seed^2): se_step from moving the target
  by the standard error of bf16's smoothed loss there (how far the crossing moves), se_seed =
  stdev(steps_ratio_s) / sqrt(S) with S >= 2 seeds; with one seed (which cannot show the spread between seeds)
  the seed-spread allowance of the loss gap (numerics.SEED_GAP_ALLOWANCE, measured on recorded runs) turned
  into steps: allowance / e, e = -(dL/dt) t / L of bf16's smoothed curve at its end (a flat curve: no band);
- effective_speedup = S(N) / steps_ratio, its band the same relative band (S(N)'s own spread left out);
- tokens and wall-clock to the target: steps x tokens per step, steps x the median step time of each point.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypedDict

from pydantic import BaseModel, ConfigDict

from core.analysis.curves import CurveDigest, raw_points, smoothed
from core.analysis.numerics import MIN_EVAL_POINTS, SEED_GAP_ALLOWANCE, Z_BAND, Curves, first_by_seed, slope

CHECKPOINTS = (0.25, 0.5, 0.75, 0.9, 1.0)
MIN_CURVE_POINTS = 4  # smoothed points of a curve needed to match losses
MAX_EXTRAPOLATION = 0.25  # fp8's crossing is extrapolated at most this fraction of its steps past its end
MIN_ELASTICITY = 0.01  # one seed on a curve flatter than this (relative loss per relative step): no band


class LossMatch(BaseModel):
    """One matched point: the loss bf16 reached by a checkpoint, and when each precision reached it (mean
    over seeds; fp8_step None when fp8 did not reach it in some seed)."""

    model_config = ConfigDict(frozen=True)

    fraction: float  # the checkpoint, a fraction of bf16's steps
    loss: float  # the target (mean over seeds)
    bf16_step: float
    fp8_step: float | None = None
    steps_ratio: float | None = None


class TimeToLoss(BaseModel):
    model_config = ConfigDict(frozen=True)

    steps_ratio: float | None = None  # fp8 steps / bf16 steps to bf16's end loss (> 1: fp8 needs more)
    steps_ratio_band: float | None = None  # half-width
    effective_speedup: float | None = None  # S(N) / steps_ratio
    effective_speedup_band: float | None = None
    reason: str  # how it was measured, or why there is no ratio
    source: str | None = None  # eval | train
    num_seeds: int = 0
    seed_allowance: float | None = None  # one seed: the allowance in the band
    target_loss: float | None = None  # bf16's loss at the end of its run (smoothed, best reached; seed mean)
    bf16_steps: float | None = None  # steps to the target, seed mean
    fp8_steps: float | None = None
    bf16_tokens: float | None = None  # tokens to the target (steps x tokens per step)
    fp8_tokens: float | None = None
    bf16_time_s: float | None = None  # wall-clock to the target at the measured step time
    fp8_time_s: float | None = None
    shortfall: float | None = None  # fp8 never reached the target: (fp8's lowest - target) / target, seed mean
    extrapolated: bool = False  # fp8's crossing extrapolated past its end in some seed (see shortfall)
    matches: list[LossMatch] = []


class _Common(TypedDict, total=False):
    """The fields every TimeToLoss of one match_losses call shares (filled as they are known)."""

    source: str
    num_seeds: int
    matches: list[LossMatch]
    target_loss: float
    bf16_steps: float


def first_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first step where a (step, loss) curve is at or below target (linear between points); None: never."""
    prev = None
    for x, y in curve:
        if math.isfinite(y) and y <= target:
            if prev is None:
                return x
            (x0, y0) = prev
            return x0 + (x - x0) * (y0 - target) / (y0 - y) if y0 != y else x
        prev = (x, y) if math.isfinite(y) else None
    return None


def extrapolated_reach(
    curve: Sequence[tuple[float, float]], target: float, max_fraction: float = MAX_EXTRAPOLATION
) -> float | None:
    """Where the straight line through the last quarter of a (log step, loss) curve reaches target, at or after its
    last step and at most max_fraction of its steps past it; None when the line does not fall or gets there
    later."""
    tail = [(math.log(x), y) for x, y in curve[-max(3, len(curve) // 4) :] if math.isfinite(y) and x > 0]
    if len(tail) < 2:
        return None
    xs, ys = [x for x, _ in tail], [y for _, y in tail]
    c = slope(xs, ys)  # loss per e-fold of steps: loss curves are closer to straight in log(step)
    if c >= 0:
        return None
    x = max(math.exp(min(50.0, statistics.fmean(xs) + (target - statistics.fmean(ys)) / c)), curve[-1][0])
    return x if x <= curve[-1][0] * (1 + max_fraction) else None


def _reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    x = first_reach(curve, target)
    return x if x is not None else extrapolated_reach(curve, target)


def _best_by(curve: Sequence[tuple[float, float]], step: float) -> float | None:
    vals = [y for x, y in curve if x <= step and math.isfinite(y)]
    return min(vals) if vals else None


def _local_se(d: CurveDigest, source: str, curve: Sequence[tuple[float, float]]) -> float:
    """Standard error of the smoothed loss near the end: residuals of the raw points around the smoothed curve
    over the last quarter, over sqrt(points averaged)."""
    xs, ys, _ = raw_points(d, source)
    q = max(3, len(xs) // 4)
    res = [y - s for (x, y), (_, s) in zip(list(zip(xs, ys))[-q:], curve[-q:]) if math.isfinite(y - s)]
    if len(res) < 2:
        return 0.0
    return statistics.stdev(res) / math.sqrt(min(len(xs), 5 if source == "train" else 3))


def _source(pairs: Sequence[tuple[CurveDigest, CurveDigest]]) -> str:
    return (
        "eval"
        if all(r.num_eval_in(0, r.num_steps) >= max(MIN_EVAL_POINTS, MIN_CURVE_POINTS) for p in pairs for r in p)
        else "train"
    )


def time_to_loss(
    fp8_runs: Sequence[Curves],
    bf16_runs: Sequence[Curves],
    *,
    speedup: float | None = None,
    fp8_step_ms: float | None = None,
    bf16_step_ms: float | None = None,
    fp8_tokens_per_step: float | None = None,
    bf16_tokens_per_step: float | None = None,
    seed_allowance: float | None = None,
) -> TimeToLoss:
    """Time to the same loss of one fp8 point against its bf16 twin (module docstring), priced (see price)."""
    return price(
        match_losses(fp8_runs, bf16_runs, seed_allowance=seed_allowance),
        speedup=speedup,
        fp8_step_ms=fp8_step_ms,
        bf16_step_ms=bf16_step_ms,
        fp8_tokens_per_step=fp8_tokens_per_step,
        bf16_tokens_per_step=bf16_tokens_per_step,
    )


def price(
    t: TimeToLoss,
    *,
    speedup: float | None,
    fp8_step_ms: float | None = None,
    bf16_step_ms: float | None = None,
    fp8_tokens_per_step: float | None = None,
    bf16_tokens_per_step: float | None = None,
) -> TimeToLoss:
    """The matched steps priced with the points' throughput: effective_speedup = S(N) / steps_ratio (its band
    the ratio's relative band), tokens and wall-clock to the target (cheap: the curves are not read again)."""
    upd: dict[str, object] = {}
    if t.bf16_steps is not None:
        upd |= _costs("bf16", t.bf16_steps, bf16_step_ms, bf16_tokens_per_step)
    if t.fp8_steps is not None:
        upd |= _costs("fp8", t.fp8_steps, fp8_step_ms, fp8_tokens_per_step)
    ratio, band = t.steps_ratio, t.steps_ratio_band
    if ratio is not None and ratio > 0 and speedup:
        eff = speedup / ratio
        upd |= dict(effective_speedup=eff, effective_speedup_band=eff * band / ratio if band is not None else None)
    elif ratio is not None:
        upd["reason"] = t.reason + "; no throughput speedup to divide"
    return t.model_copy(update=upd)


def match_losses(
    fp8_runs: Sequence[Curves], bf16_runs: Sequence[Curves], *, seed_allowance: float | None = None
) -> TimeToLoss:
    """The curve part of time_to_loss: matched steps, steps_ratio and its band, shortfall (no prices)."""
    fp8, bf16 = first_by_seed(fp8_runs), first_by_seed(bf16_runs)
    if not fp8 or not bf16:
        return TimeToLoss(reason=f"no {'fp8' if not fp8 else 'bf16'} loss curve")
    seeds = sorted(set(fp8) & set(bf16))
    if not seeds:
        return TimeToLoss(reason=f"no bf16 run with seed {', '.join(map(str, sorted(fp8)))}")
    pairs = [(fp8[s], bf16[s]) for s in seeds]
    source = _source(pairs)
    curves = [(smoothed(f, source), smoothed(b, source), b) for f, b in pairs]
    if any(len(fc) < MIN_CURVE_POINTS or len(bc) < MIN_CURVE_POINTS for fc, bc, _ in curves):
        return TimeToLoss(
            reason=f"too few points to match losses (at least {MIN_CURVE_POINTS} per curve; more steps would help)",
            source=source,
            num_seeds=len(seeds),
        )
    matches: list[LossMatch] = []
    # per seed at the end checkpoint: (target, t_bf16, t_fp8 or None when fp8 never reached it, fp8's lowest)
    end: list[tuple[float, float, float | None, float]] | None = None
    for frac in CHECKPOINTS:
        per_seed: list[tuple[float, float, float | None, float]] = []
        for fc, bc, _ in curves:
            last = bc[-1][0] if frac == 1.0 else bc[0][0] + frac * (bc[-1][0] - bc[0][0])
            target = _best_by(bc, last)
            if target is None:
                break
            t_b = first_reach(bc, target)
            assert t_b is not None  # target is a finite loss of bc itself, so bc reaches it
            t_f = first_reach(fc, target)
            per_seed.append((target, t_b, t_f, min((y for _, y in fc if math.isfinite(y)), default=math.nan)))
        if len(per_seed) < len(curves):
            continue
        reached = all(t_f is not None for _, _, t_f, _ in per_seed)
        ratios = [t_f / t_b for _, t_b, t_f, _ in per_seed if t_f is not None and t_b]
        matches.append(
            LossMatch(
                fraction=frac,
                loss=statistics.fmean(t for t, *_ in per_seed),
                bf16_step=statistics.fmean(t_b for _, t_b, _, _ in per_seed),
                fp8_step=statistics.fmean(t_f for _, _, t_f, _ in per_seed if t_f is not None) if reached else None,
                steps_ratio=statistics.fmean(ratios) if reached and len(ratios) == len(per_seed) else None,
            )
        )
        if frac == 1.0:
            end = per_seed
    common = _Common(source=source, num_seeds=len(seeds), matches=matches)
    if end is None:
        return TimeToLoss(reason="bf16's smoothed loss is not finite", **common)
    target = statistics.fmean(t for t, *_ in end)
    t_bf16 = statistics.fmean(t_b for _, t_b, _, _ in end)
    common["target_loss"], common["bf16_steps"] = target, t_bf16
    missed = [(s, t, lowest) for s, (t, _, t_f, lowest) in zip(seeds, end) if t_f is None]
    short = statistics.fmean((lowest - t) / t for _, t, lowest in missed) if missed else None
    which = ", ".join(str(s) for s, *_ in missed)
    # the crossing of every seed: fp8's own, else extrapolated (only a seed that missed is extrapolated)
    ext = [extrapolated_reach(fc, t) if t_f is None else t_f for (fc, _, _), (t, _, t_f, _) in zip(curves, end)]
    crossed = [(t, t_b, x, lowest) for (t, t_b, _, lowest), x in zip(end, ext) if x is not None]
    if len(crossed) < len(end):  # a seed fp8 missed, not reached by extrapolation either
        return TimeToLoss(
            reason=(
                f"fp8 never reached bf16's end {source} loss {target:.4g} within its run (seed {which}): short "
                f"by {short:+.2%}, more than the last quarter's slope makes up within "
                f"{MAX_EXTRAPOLATION:.0%} more steps"
            ),
            shortfall=short,
            **common,
        )
    ratios = [t_f / t_b for _, t_b, t_f, _ in crossed]
    ses = []
    for (fc, bc, b), (t, t_b, _, _) in zip(curves, crossed):
        se_l = _local_se(b, source, bc)
        lo, hi = _reach(fc, t - Z_BAND * se_l), _reach(fc, t + Z_BAND * se_l)
        if lo is None:  # not even by extrapolation: the crossing moves at least that far
            lo = fc[-1][0] * (1 + MAX_EXTRAPOLATION)
        ses.append(abs((lo - hi) / 2 / Z_BAND / t_b) if hi is not None else 0.0)
    num = len(ratios)
    ratio = statistics.fmean(ratios)
    allowance = None
    if num >= 2:
        se_seed = statistics.stdev(ratios) / math.sqrt(num)
    else:
        gap_allowance = SEED_GAP_ALLOWANCE[source] if seed_allowance is None else seed_allowance
        bc = curves[0][1]
        tail = bc[-max(3, len(bc) // 4) :]
        e = -slope([x for x, _ in tail], [y for _, y in tail]) * bc[-1][0] / bc[-1][1]
        allowance = gap_allowance / e if e >= MIN_ELASTICITY else math.inf
        se_seed = allowance
    half_width = Z_BAND * math.hypot(math.sqrt(sum(se * se for se in ses)) / num, se_seed)
    band = half_width if math.isfinite(half_width) else None
    t_fp8 = statistics.fmean(t_f for _, _, t_f, _ in crossed)
    if band is None:
        noise = "one seed on a flat curve: no band; 2+ seeds give one"
    elif num >= 2:
        noise = f"±{band:.3f}, seed spread and step noise, {num} seeds"
    else:
        noise = f"±{band:.3f}, step noise and a seed-spread allowance, one seed; 2+ seeds narrow it"
    how = (
        f"; extrapolated past fp8's end along its last quarter (seed {which} fell short by {short:+.2%} in the run)"
        if missed
        else ""
    )
    return TimeToLoss(
        steps_ratio=ratio,
        steps_ratio_band=band,
        reason=(
            f"fp8 reaches bf16's end {source} loss {target:.4g} in {t_fp8:.0f} steps against {t_bf16:.0f}: "
            f"steps_ratio {ratio:.3f} ({noise}){how}"
        ),
        shortfall=short,
        extrapolated=bool(missed),
        seed_allowance=allowance if allowance is not None and math.isfinite(allowance) else None,
        fp8_steps=t_fp8,
        **common,
    )


def _costs(prefix: str, steps: float, step_ms: float | None, tokens_per_step: float | None) -> dict[str, float | None]:
    return {
        f"{prefix}_tokens": steps * tokens_per_step if tokens_per_step else None,
        f"{prefix}_time_s": steps * step_ms / 1000 if step_ms else None,
    }


def short_effective(t: TimeToLoss | None) -> str:
    """A table cell: `0.97x ±0.05` (effective speedup), `short 2.3%`, or `-`."""
    if t is None:
        return "-"
    if t.effective_speedup is not None:
        band = t.effective_speedup_band
        mark = "~" if t.extrapolated else ""  # the crossing was extrapolated past fp8's end
        return f"{mark}{t.effective_speedup:.2f}x" + (f" ±{band:.2f}" if band is not None else "")
    if t.shortfall is not None:  # a shortfall below the cell's resolution is not shown as 0.0%
        return f"short {t.shortfall:.1%}" if round(t.shortfall, 3) > 0 else "short <0.1%"
    return "-"
