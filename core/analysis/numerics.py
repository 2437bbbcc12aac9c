"""Does fp8 loss track bf16? A verdict with its noise, from the loss curves of paired runs (pure; core only).

The final step's loss alone answers a different question (where a still-falling curve happened to stop), so
the verdict compares windows, with a noise band:

- pairs: an fp8 run and the bf16 run of the same point and the same seed (same initial weights, same batches
  at every step: runner.data addresses a batch by seed and step). Repeats of a seed: the first run is used.
- source: the held-out (eval) loss when every paired run has at least MIN_EVAL_POINTS evaluations in the
  last quarter of its steps (eval points are sparse: their window is that quarter); else the training loss.
- window: the last K = min(MAX_WINDOW_STEPS, steps // 4) steps (training loss); steps = the shortest paired run.
- per seed s: gap_s = (mean fp8 - mean bf16) / mean bf16 over the window's common steps; its step-to-step
  standard error se_s = stdev(fp8_t - bf16_t) / sqrt(points) / mean bf16 (paired differences: the batch's own
  difficulty cancels).
- gap = mean of gap_s over seeds; band = Z_BAND * sqrt(se_step^2 + se_seed^2), se_step = sqrt(sum se_s^2) / S,
  se_seed = stdev(gap_s) / sqrt(S) with S >= 2 seeds (0 with one seed: then the band is the step noise only).
- slope: least-squares loss per step over the window, of both curves (mean over seeds).
- verdict, in this order:
    inconclusive  bf16 missing (no bf16 run of the fp8 run's seed), too few steps (K < MIN_WINDOW_STEPS), or
                  loss still falling: either curve drops more in K steps than max(band, tolerance) (relative),
                  so a lag of a few steps alone could make the gap;
    differs       |gap| > max(band, tolerance): outside the noise and beyond the tolerance (also: fp8 loss not
                  finite in the window while bf16's is);
    tracks        |gap| <= tolerance with band <= tolerance;
    inconclusive  otherwise: the band is wider than the tolerance (more seeds or steps narrow it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Verdict = Literal["tracks", "differs", "inconclusive"]
VERDICTS: tuple[str, ...] = ("tracks", "differs", "inconclusive")
DEFAULT_TOLERANCE = 0.01  # |gap| within 1% of bf16's loss counts as tracking
MAX_WINDOW_STEPS = 50  # K = min(50, steps // 4)
MIN_WINDOW_STEPS = 8  # fewer window steps (runs shorter than 32 steps): too few to estimate the noise
MIN_EVAL_POINTS = 2  # evaluations in the last quarter needed to prefer eval loss
Z_BAND = 2.0  # band = 2 standard errors: ~95% for a normal error


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


class LossVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    reason: str
    gap: float | None = None  # (fp8 - bf16) / bf16 mean loss over the window, mean over seeds (signed fraction)
    band: float | None = None  # half-width of the noise band around the gap (fraction)
    tolerance: float = DEFAULT_TOLERANCE
    source: Literal["eval", "train"] | None = None  # which loss was compared
    window_first_step: int | None = None  # the window, in training steps (inclusive)
    window_last_step: int | None = None
    window_steps: int | None = None  # K
    fp8_slope: float | None = None  # loss per step over the window (least squares), mean over seeds
    bf16_slope: float | None = None
    fp8_window_loss: float | None = None  # mean over the window and seeds
    bf16_window_loss: float | None = None
    num_seeds: int = 0  # seeds with both an fp8 and a bf16 curve


def window_steps(num_steps: int, max_window: int = MAX_WINDOW_STEPS) -> int:
    """K = min(max_window, num_steps // 4)."""
    return min(max_window, num_steps // 4)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than 2 distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def _first_by_seed(runs: Sequence[RunLosses]) -> dict[int, RunLosses]:
    out: dict[int, RunLosses] = {}
    for r in runs:
        if r.steps or r.eval_steps:
            out.setdefault(r.seed, r)
    return out


def _points(r: RunLosses, source: str, first: int, last: int) -> dict[int, float]:
    """{step: loss} of the curve within [first, last]; non-finite losses kept as nan (divergence shows)."""
    steps, losses = (r.eval_steps, r.eval_losses) if source == "eval" else (r.steps, r.losses)
    return {
        s: (v if v is not None and math.isfinite(v) else math.nan) for s, v in zip(steps, losses) if first <= s <= last
    }


def _eval_usable(r: RunLosses, first: int, last: int) -> bool:
    pts = _points(r, "eval", first, last)
    return sum(math.isfinite(v) for v in pts.values()) >= MIN_EVAL_POINTS


@dataclass(frozen=True, slots=True)
class _SeedGap:
    gap: float
    se: float
    fp8_slope: float
    bf16_slope: float
    fp8_mean: float
    bf16_mean: float


def _seed_gap(fp8: dict[int, float], bf16: dict[int, float]) -> _SeedGap | str:
    """The window's gap of one seed, or why there is none."""
    common = sorted(set(fp8) & set(bf16))
    if len(common) < 2:
        return "too few common steps in the window"
    b = [bf16[s] for s in common]
    f = [fp8[s] for s in common]
    if not all(map(math.isfinite, b)):
        return "bf16 loss is not finite in the window"
    if not all(map(math.isfinite, f)):
        return "fp8 loss is not finite in the window"
    b_mean, f_mean = statistics.fmean(b), statistics.fmean(f)
    if b_mean <= 0:
        return f"bf16 window loss {b_mean:.4g} is not positive"
    diffs = [x - y for x, y in zip(f, b)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) / b_mean
    xs = [float(s) for s in common]
    return _SeedGap(
        gap=(f_mean - b_mean) / b_mean,
        se=se,
        fp8_slope=slope(xs, f),
        bf16_slope=slope(xs, b),
        fp8_mean=f_mean,
        bf16_mean=b_mean,
    )


def loss_verdict(
    fp8_runs: Sequence[RunLosses],
    bf16_runs: Sequence[RunLosses],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    max_window: int = MAX_WINDOW_STEPS,
) -> LossVerdict:
    """The verdict of one fp8 point (its runs, every seed and repeat) against its bf16 twin's runs."""
    if tolerance <= 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    no: dict[str, Any] = dict(verdict="inconclusive", tolerance=tolerance)
    fp8, bf16 = _first_by_seed(fp8_runs), _first_by_seed(bf16_runs)
    if not fp8:
        return LossVerdict(reason="no fp8 loss curve", **no)
    if not bf16:
        return LossVerdict(reason="bf16 missing: no bf16 loss curve at this point", **no)
    seeds = sorted(set(fp8) & set(bf16))
    if not seeds:
        return LossVerdict(reason=f"bf16 missing: no bf16 run with seed {', '.join(map(str, sorted(fp8)))}", **no)
    n = min(min(fp8[s].trained_steps, bf16[s].trained_steps) for s in seeds)
    k = window_steps(n, max_window)
    if k < MIN_WINDOW_STEPS:
        return LossVerdict(
            reason=f"too few steps: {n} steps give a {k}-step window (at least {MIN_WINDOW_STEPS}: "
            f"{4 * MIN_WINDOW_STEPS}+ steps)",
            window_steps=k,
            num_seeds=len(seeds),
            **no,
        )
    last = n - 1
    eval_first = n - n // 4
    pairs = [(fp8[s], bf16[s]) for s in seeds]
    if all(_eval_usable(r, eval_first, last) for pair in pairs for r in pair):
        source, first = "eval", eval_first
    else:
        source, first = "train", n - k
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
        g = _seed_gap(_points(f, source, first, last), _points(b, source, first, last))
        if isinstance(g, str):
            verdict: Verdict = "differs" if g.startswith("fp8 loss is not finite") else "inconclusive"
            return LossVerdict(verdict=verdict, reason=f"{g} (seed {f.seed}, {source} loss)", **where)
        gaps.append(g)
    num = len(gaps)
    gap = statistics.fmean(g.gap for g in gaps)
    se_step = math.sqrt(sum(g.se**2 for g in gaps)) / num
    se_seed = statistics.stdev(g.gap for g in gaps) / math.sqrt(num) if num >= 2 else 0.0
    band = Z_BAND * math.hypot(se_step, se_seed)
    f_slope = statistics.fmean(g.fp8_slope for g in gaps)
    b_slope = statistics.fmean(g.bf16_slope for g in gaps)
    b_loss = statistics.fmean(g.bf16_mean for g in gaps)
    f_loss = statistics.fmean(g.fp8_mean for g in gaps)
    values: dict[str, Any] = dict(
        gap=gap,
        band=band,
        fp8_slope=f_slope,
        bf16_slope=b_slope,
        fp8_window_loss=f_loss,
        bf16_window_loss=b_loss,
        **where,
    )
    noise = "seed spread and step noise" if num >= 2 else "step noise, one seed"
    # relative drop of each curve over K steps: the gap a lag of up to K steps could make on its own
    drop = max(-b_slope * k / b_loss, -f_slope * k / f_loss)
    limit = max(band, tolerance)
    if drop > limit:
        return LossVerdict(
            verdict="inconclusive",
            reason=(
                f"loss still falling: {drop:.1%} per {k} steps over steps {first}-{last}, more than the band "
                f"(±{band:.2%}) and the tolerance ({tolerance:.0%}); gap {gap:+.2%}"
            ),
            **values,
        )
    if abs(gap) > limit:
        return LossVerdict(
            verdict="differs",
            reason=(
                f"{source} loss gap {gap:+.2%} is outside the band ±{band:.2%} ({noise}) and the {tolerance:.0%} "
                f"tolerance, steps {first}-{last}"
            ),
            **values,
        )
    if band <= tolerance:
        return LossVerdict(
            verdict="tracks",
            reason=(
                f"{source} loss gap {gap:+.2%} ±{band:.2%} ({noise}) within the {tolerance:.0%} tolerance, "
                f"steps {first}-{last}"
            ),
            **values,
        )
    return LossVerdict(
        verdict="inconclusive",
        reason=(f"too noisy: band ±{band:.2%} ({noise}) is wider than the {tolerance:.0%} tolerance; gap {gap:+.2%}"),
        **values,
    )


def short_verdict(v: LossVerdict | None) -> str:
    """What a table column shows: `tracks +0.2% ±0.4%`, `differs +3.1% ±0.5%`, `inconclusive: loss still
    falling`."""
    if v is None:
        return "-"
    if v.verdict == "inconclusive":
        return f"inconclusive: {v.reason.split(':')[0]}"
    if v.gap is None or v.band is None:
        return f"{v.verdict}: {v.reason.split(' (')[0]}"
    return f"{v.verdict} {v.gap:+.1%} ±{v.band:.1%}"
