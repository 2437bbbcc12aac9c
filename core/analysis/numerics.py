"""Does fp8 loss track bf16? A verdict with its noise, from the loss curves of paired runs (pure; core only).

The final step's loss alone answers a different question (where a still-falling curve happened to stop), so
the verdict follows the gap between the curves over the end of the run, and how the gap itself moves:

- pairs: an fp8 run and the bf16 run of the same point and the same seed (same initial weights, same batches
  at every step: runner.data addresses a batch by seed and step). Repeats of a seed: the first run is used.
- curves: each run's digest (core.analysis.curves: training loss in bins of equal width, held-out loss point
  by point), computed once when the run's result is stored.
- source: the held-out (eval) loss when every paired run has at least MIN_EVAL_POINTS evaluations in the
  window; else the training loss (its bins).
- window: the last quarter of the steps (steps = the shortest paired run), at least MIN_STEPS steps.
- per seed s, at the window's points t (bf16's bins or eval steps; fp8 interpolated there, the same bins
  when the runs have the same length): g_s(t) = (fp8 - bf16) / bf16. A straight line through g_s(t) gives
  the gap at the end of the run (gap_s), its standard error from the residuals (the step noise of the
  paired difference: the batch's own difficulty cancels), and the drift of the gap over the window.
- gap = mean of gap_s over seeds; band = sqrt((t * se_step)^2 + (Z_BAND * se_seed)^2), se_step =
  sqrt(sum se_s^2) / S, t = Student's 95% quantile for the residuals' degrees of freedom (at least Z_BAND),
  se_seed = stdev(gap_s) / sqrt(S) with S >= 2 seeds. With one seed the seed spread is not seen: se_seed is
  then SEED_GAP_ALLOWANCE, measured on recorded real runs (below). The drift has its band the same way.
- verdict, in this order:
    inconclusive  bf16 missing, too few steps (< MIN_STEPS), too few points in the window;
    differs       |gap| > max(band, tolerance) (also: fp8 loss not finite in the window while bf16's is),
                  unless the gap is closing (drift outside its band, towards 0, enough to bring it back within
                  the limit over another window: inconclusive, `gap still closing`);
    inconclusive  `gap still moving`: the drift is outside its band and another window of it would carry the
                  gap beyond the tolerance (more steps, or `lr_schedule: cosine`, settle it);
    tracks        |gap| <= tolerance with band <= tolerance;
    inconclusive  otherwise: the band is wider than the tolerance (more seeds or steps narrow it).
Two curves still falling in parallel (a constant relative gap) conclude: only a moving gap keeps the verdict
open, not a falling loss.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from core.analysis.curves import CurveDigest, digest_curve, interpolate, raw_points, smoothed

Verdict = Literal["tracks", "differs", "inconclusive"]
VERDICTS: tuple[str, ...] = ("tracks", "differs", "inconclusive")
DEFAULT_TOLERANCE = 0.01  # |gap| within 1% of bf16's loss counts as tracking
MIN_STEPS = 32  # shorter runs: too few steps to estimate the noise
MIN_WINDOW_POINTS = 3  # points in the window (bins or evaluations) for a line through the gap
MIN_EVAL_POINTS = 3  # evaluations in the window needed to prefer eval loss
Z_BAND = 2.0  # band = 2 standard errors: ~95% for a normal error
# Seed spread of the end gap, one seed's standard deviation (a fraction of bf16's loss) per loss source, used in
# place of the spread a single seed cannot show. Measured on the recorded real runs of
# bench/results/2026-12-04-numerics-h200.json (1B dims x 2 layers, 1,000 steps, seeds 0-2, three fp8 recipes
# against bf16): the pooled standard deviation of the per-seed end gaps around each recipe's mean, rounded up
# (held-out loss 0.26%, training loss 1.83%: the training loss of one batch varies far more between seeds);
# tests/core/analysis/test_numerics.py recomputes both from that file.
SEED_GAP_ALLOWANCE = {"eval": 0.003, "train": 0.019}


@dataclass(frozen=True, slots=True)
class RunLosses:
    """One run's loss curves, as the store gives them: training loss per step, held-out loss per eval step."""

    run_id: str
    seed: int
    steps: tuple[int, ...] = ()  # steps with a training loss (a stored curve may be thinned)
    losses: tuple[float, ...] = ()
    eval_steps: tuple[int, ...] = ()  # steps after which the held-out loss was measured
    eval_losses: tuple[float | None, ...] = ()
    num_steps: int | None = None  # steps trained; default: last step + 1

    @property
    def trained_steps(self) -> int:
        if self.num_steps is not None:
            return self.num_steps
        return self.steps[-1] + 1 if self.steps else 0

    def digest(self) -> CurveDigest:
        return digest_curve(
            list(zip(self.steps, self.losses)),
            list(zip(self.eval_steps, self.eval_losses)),
            run_id=self.run_id,
            seed=self.seed,
            num_steps=self.num_steps,
        )


Curves = RunLosses | CurveDigest


class LossVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    reason: str
    gap: float | None = None  # (fp8 - bf16) / bf16 at the end of the run (line over the window), mean over seeds
    band: float | None = None  # half-width of the noise band around the gap (fraction)
    tolerance: float = DEFAULT_TOLERANCE
    source: Literal["eval", "train"] | None = None  # which loss was compared
    window_first_step: int | None = None  # the window, in training steps (inclusive)
    window_last_step: int | None = None
    window_steps: int | None = None
    fp8_slope: float | None = None  # loss per step over the window (least squares, smoothed), mean over seeds
    bf16_slope: float | None = None
    fp8_window_loss: float | None = None  # mean over the window and seeds
    bf16_window_loss: float | None = None
    num_seeds: int = 0  # seeds with both an fp8 and a bf16 curve
    window_gap: float | None = None  # the gap's mean over the window (the line's middle), mean over seeds
    gap_drift: float | None = None  # change of the gap across the window (fraction), mean over seeds
    gap_drift_band: float | None = None
    seed_allowance: float | None = None  # one seed: the seed-spread allowance added to the band


def window_steps(num_steps: int) -> int:
    """The window: the last quarter of the steps."""
    return num_steps // 4


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than 2 distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def as_digest(c: Curves) -> CurveDigest:
    return c if isinstance(c, CurveDigest) else c.digest()


def first_by_seed(runs: Sequence[Curves]) -> dict[int, CurveDigest]:
    """The first run of each seed that has a curve, digested."""
    out: dict[int, CurveDigest] = {}
    for r in runs:
        if r.seed in out:
            continue
        d = as_digest(r)
        if d.bin_steps or d.eval_steps:
            out[r.seed] = d
    return out


@dataclass(frozen=True, slots=True)
class _SeedGap:
    num_points: int
    gap_end: float
    se_end: float
    gap_mean: float
    drift: float
    se_drift: float
    fp8_slope: float
    bf16_slope: float
    fp8_mean: float
    bf16_mean: float


def _seed_gap(f: CurveDigest, b: CurveDigest, source: str, first: int, last: int) -> _SeedGap | str:
    """The gap of one seed over the window, or why there is none."""
    bx, by, _ = raw_points(b, source)
    fx, fy, _ = raw_points(f, source)
    in_window = [(x, y) for x, y in zip(bx, by) if first <= x <= last]
    f_curve = list(zip(fx, fy))
    pts = [(x, y, interpolate(f_curve, x)) for x, y in in_window]
    if not all(math.isfinite(y) for _, y, _ in pts):
        return "bf16 loss is not finite in the window"
    if not all(math.isfinite(y) for x, y in zip(fx, fy) if first <= x <= last):
        return "fp8 loss is not finite in the window"
    pts = [p for p in pts if math.isfinite(p[2])]  # bf16 points beyond fp8's last one drop out
    if len(pts) < MIN_WINDOW_POINTS:
        return f"too few points in the window ({len(pts)}, at least {MIN_WINDOW_POINTS})"
    xs = [x for x, _, _ in pts]
    if any(y <= 0 for _, y, _ in pts):
        return "bf16 loss is not positive in the window"
    gs = [(fv - bv) / bv for _, bv, fv in pts]
    n = len(xs)
    mx = statistics.fmean(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    c = slope(xs, gs)
    a = statistics.fmean(gs)
    resid = [g - (a + c * (x - mx)) for x, g in zip(xs, gs)]
    s = math.sqrt(sum(r * r for r in resid) / (n - 2)) if n > 2 else 0.0
    x_end = float(last)
    span = float(last - first + 1)
    se_end = s * math.sqrt(1 / n + (x_end - mx) ** 2 / sxx) if sxx else s
    se_c = s / math.sqrt(sxx) if sxx else 0.0
    f_sm = [(x, y) for x, y in smoothed(f, source) if first <= x <= last]
    b_sm = [(x, y) for x, y in smoothed(b, source) if first <= x <= last]
    return _SeedGap(
        num_points=n,
        gap_end=a + c * (x_end - mx),
        se_end=se_end,
        gap_mean=a,
        drift=c * span,
        se_drift=se_c * span,
        fp8_slope=slope([x for x, _ in f_sm], [y for _, y in f_sm]),
        bf16_slope=slope([x for x, _ in b_sm], [y for _, y in b_sm]),
        fp8_mean=statistics.fmean(v for _, _, v in pts),
        bf16_mean=statistics.fmean(v for _, v, _ in pts),
    )


# Student's t, two-sided 95%, by degrees of freedom: a standard error from the residuals of a few points
# (held-out loss: 5 evaluations in a window) is itself uncertain, and Z_BAND would understate its band.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 10: 2.23, 15: 2.13, 20: 2.09, 30: 2.04}


def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t for dof degrees of freedom (the next smaller tabulated
    dof: conservative), at least Z_BAND."""
    if dof < 1:
        return math.inf
    return max(Z_BAND, _T95[max(k for k in _T95 if k <= dof)])


def _combined(values: Sequence[float], ses: Sequence[float], allowance: float, dof: int) -> float:
    """sqrt((t * se_step)^2 + (Z_BAND * se_seed)^2) of a mean over seeds (one seed: se_seed = allowance); t for
    the residuals' dof."""
    num = len(values)
    se_step = math.sqrt(sum(se * se for se in ses)) / num
    se_seed = statistics.stdev(values) / math.sqrt(num) if num >= 2 else allowance
    return math.hypot(t95(dof) * se_step, Z_BAND * se_seed)


def loss_verdict(
    fp8_runs: Sequence[Curves],
    bf16_runs: Sequence[Curves],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    seed_allowance: float | None = None,
) -> LossVerdict:
    """The verdict of one fp8 point (its runs, every seed and repeat) against its bf16 twin's runs (their
    curves as RunLosses or, cheaper, as stored digests). seed_allowance: one seed's seed-spread allowance
    (default SEED_GAP_ALLOWANCE of the loss source)."""
    if tolerance <= 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    no: dict[str, Any] = dict(verdict="inconclusive", tolerance=tolerance)
    fp8, bf16 = first_by_seed(fp8_runs), first_by_seed(bf16_runs)
    if not fp8:
        return LossVerdict(reason="no fp8 loss curve", **no)
    if not bf16:
        return LossVerdict(reason="bf16 missing: no bf16 loss curve at this point", **no)
    seeds = sorted(set(fp8) & set(bf16))
    if not seeds:
        return LossVerdict(reason=f"bf16 missing: no bf16 run with seed {', '.join(map(str, sorted(fp8)))}", **no)
    n = min(min(fp8[s].num_steps, bf16[s].num_steps) for s in seeds)
    k = window_steps(n)
    if n < MIN_STEPS:
        return LossVerdict(
            reason=f"too few steps: {n} (at least {MIN_STEPS}; more steps would help)",
            window_steps=k,
            num_seeds=len(seeds),
            **no,
        )
    last, first = n - 1, n - k
    pairs = [(fp8[s], bf16[s]) for s in seeds]
    source = "eval" if all(r.num_eval_in(first, last) >= MIN_EVAL_POINTS for p in pairs for r in p) else "train"
    where: dict[str, Any] = dict(
        source=source,
        window_first_step=first,
        window_last_step=last,
        window_steps=k,
        num_seeds=len(seeds),
        tolerance=tolerance,
    )
    gaps: list[_SeedGap] = []
    for f, b in pairs:
        g = _seed_gap(f, b, source, first, last)
        if isinstance(g, str):
            verdict: Verdict = "differs" if g.startswith("fp8 loss is not finite") else "inconclusive"
            hint = "" if verdict == "differs" else "; more steps would help"
            return LossVerdict(verdict=verdict, reason=f"{g} (seed {f.seed}, {source} loss){hint}", **where)
        gaps.append(g)
    num = len(gaps)
    if seed_allowance is None:
        seed_allowance = SEED_GAP_ALLOWANCE[source]
    allowance = seed_allowance if num == 1 else None
    gap = statistics.fmean(g.gap_end for g in gaps)
    dof = sum(g.num_points - 2 for g in gaps)
    band = _combined([g.gap_end for g in gaps], [g.se_end for g in gaps], seed_allowance, dof)
    drift = statistics.fmean(g.drift for g in gaps)
    drift_band = _combined([g.drift for g in gaps], [g.se_drift for g in gaps], 0.0, dof)
    values: dict[str, Any] = dict(
        gap=gap,
        band=band,
        window_gap=statistics.fmean(g.gap_mean for g in gaps),
        gap_drift=drift,
        gap_drift_band=drift_band,
        seed_allowance=allowance,
        fp8_slope=statistics.fmean(g.fp8_slope for g in gaps),
        bf16_slope=statistics.fmean(g.bf16_slope for g in gaps),
        fp8_window_loss=statistics.fmean(g.fp8_mean for g in gaps),
        bf16_window_loss=statistics.fmean(g.bf16_mean for g in gaps),
        **where,
    )
    noise = (
        "seed spread and step noise"
        if num >= 2
        else f"step noise and a seed-spread allowance of ±{Z_BAND * seed_allowance:.1%}, one seed"
    )
    limit = max(band, tolerance)
    moving = abs(drift) > drift_band
    span = f"steps {first}-{last}"
    if abs(gap) > limit:
        if moving and drift * gap < 0 and abs(drift) >= abs(gap) - limit:
            return LossVerdict(
                verdict="inconclusive",
                reason=(
                    f"gap still closing: {gap:+.2%} at the end, moved {drift:+.2%} (±{drift_band:.2%}) over {span}; "
                    "more steps or lr_schedule: cosine would settle it"
                ),
                **values,
            )
        return LossVerdict(
            verdict="differs",
            reason=(
                f"{source} loss gap {gap:+.2%} is outside the band ±{band:.2%} ({noise}) and the {tolerance:.0%} "
                f"tolerance at the end of the run, {span}"
            ),
            **values,
        )
    if moving and abs(gap + drift) > tolerance:
        return LossVerdict(
            verdict="inconclusive",
            reason=(
                f"gap still moving: {gap:+.2%} at the end, moved {drift:+.2%} (±{drift_band:.2%}) over {span}; "
                "more steps or lr_schedule: cosine would settle it"
            ),
            **values,
        )
    if band <= tolerance:
        return LossVerdict(
            verdict="tracks",
            reason=(
                f"{source} loss gap {gap:+.2%} ±{band:.2%} ({noise}) within the {tolerance:.0%} tolerance, "
                f"steady over {span}"
            ),
            **values,
        )
    help_ = "more seeds" if num == 1 else f"more seeds than {num} or more steps"
    return LossVerdict(
        verdict="inconclusive",
        reason=(
            f"too noisy: band ±{band:.2%} ({noise}) is wider than the {tolerance:.0%} tolerance; gap {gap:+.2%}; "
            f"{help_} would narrow it"
        ),
        **values,
    )


def short_verdict(v: LossVerdict | None) -> str:
    """What a table column shows: `tracks +0.2% ±0.4%`, `differs +3.1% ±0.5%`, `inconclusive: gap still
    moving`."""
    if v is None:
        return "-"
    if v.verdict == "inconclusive":
        return f"inconclusive: {v.reason.split(':')[0]}"
    if v.gap is None or v.band is None:
        return f"{v.verdict}: {v.reason.split(' (')[0]}"
    return f"{v.verdict} {v.gap:+.1%} ±{v.band:.1%}"
