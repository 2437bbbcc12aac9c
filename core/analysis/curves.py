"""A run's loss curves reduced once, when its result is stored, to what every report reads (pure; core only).

A report compares curves (the fp8 loss verdict, time to the same loss); reading and reducing every stored
curve on each read costs more than the rest of the report. So a run's curves are digested once:

- training loss: the steps are cut into at most NUM_BINS bins of equal width w = ceil(num_steps / NUM_BINS)
  (bin j holds steps j*w .. (j+1)*w - 1, the same bins for two runs of the same length, so a bin of an fp8
  run and of its bf16 twin average the same batches); per bin the mean step, the mean loss, the standard
  deviation and the count of its points. A non-finite loss makes its bin's mean nan (a divergence shows).
- held-out (eval) loss: kept point by point (sparse already), at most MAX_EVAL_POINTS (thinned evenly).

`smoothed` turns either into a smoothed curve, (step, loss) pairs: a count-weighted running mean over a few
neighbouring bins, of the steps as of the losses (on a curve that is locally straight the pair lies on it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NUM_BINS = 64
MAX_EVAL_POINTS = 256
TRAIN_SMOOTHING_BINS = 2  # half-width of the running mean over training bins (5 bins: ~8% of the run)
EVAL_SMOOTHING_POINTS = 1  # half-width over eval points (3 points; each is already an average over batches)
DIGEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class CurveDigest:
    """One run's curves, reduced (see the module docstring). Tuples of equal length per curve."""

    run_id: str
    seed: int
    num_steps: int  # steps trained (last step + 1)
    bin_steps: tuple[float, ...] = ()  # mean step of each non-empty bin
    bin_losses: tuple[float, ...] = ()  # mean training loss of the bin (nan: a non-finite loss in it)
    bin_sds: tuple[float, ...] = ()  # standard deviation of the bin's losses (0 for one point)
    bin_counts: tuple[int, ...] = ()
    eval_steps: tuple[int, ...] = ()
    eval_losses: tuple[float, ...] = ()  # nan: not finite (or not measured)

    def with_identity(self, run_id: str, seed: int) -> CurveDigest:
        return CurveDigest(
            run_id=run_id,
            seed=seed,
            num_steps=self.num_steps,
            bin_steps=self.bin_steps,
            bin_losses=self.bin_losses,
            bin_sds=self.bin_sds,
            bin_counts=self.bin_counts,
            eval_steps=self.eval_steps,
            eval_losses=self.eval_losses,
        )

    def num_eval_in(self, first: float, last: float) -> int:
        return sum(first <= s <= last and math.isfinite(v) for s, v in zip(self.eval_steps, self.eval_losses))


def bin_width(num_steps: int, num_bins: int = NUM_BINS) -> int:
    return max(1, -(-num_steps // num_bins))


def _finite_or_nan(v: float | None) -> float:
    return v if v is not None and math.isfinite(v) else math.nan


def digest_curve(
    points: Sequence[tuple[int, float | None]],
    eval_points: Sequence[tuple[int, float | None]] = (),
    *,
    run_id: str = "",
    seed: int = 0,
    num_steps: int | None = None,
    num_bins: int = NUM_BINS,
) -> CurveDigest:
    """The digest of a run's (step, training loss) and (step, held-out loss) points (any order; None: not
    measured, left out of the training bins, nan in the eval points). num_steps: default last step + 1."""
    train = sorted((s, v) for s, v in points if v is not None)
    evals = sorted((s, _finite_or_nan(v)) for s, v in eval_points)
    last = max([s for s, _ in train] + [s for s, _ in evals], default=-1)
    n = num_steps if num_steps is not None else last + 1
    w = bin_width(max(n, last + 1), num_bins)
    bins: dict[int, list[tuple[int, float]]] = {}
    for s, v in train:
        bins.setdefault(s // w, []).append((s, v))
    steps, means, sds, counts = [], [], [], []
    for j in sorted(bins):
        pts = bins[j]
        vals = [v for _, v in pts]
        finite = all(math.isfinite(v) for v in vals)
        steps.append(statistics.fmean(s for s, _ in pts))
        means.append(statistics.fmean(vals) if finite else math.nan)
        sds.append((statistics.stdev(vals) if len(vals) > 1 else 0.0) if finite else math.nan)
        counts.append(len(pts))
    if len(evals) > MAX_EVAL_POINTS:
        k = -(-len(evals) // MAX_EVAL_POINTS)
        evals = evals[::k] if (len(evals) - 1) % k == 0 else [*evals[::k], evals[-1]]
    return CurveDigest(
        run_id=run_id,
        seed=seed,
        num_steps=n,
        bin_steps=tuple(steps),
        bin_losses=tuple(means),
        bin_sds=tuple(sds),
        bin_counts=tuple(counts),
        eval_steps=tuple(s for s, _ in evals),
        eval_losses=tuple(v for _, v in evals),
    )


def raw_points(d: CurveDigest, source: str) -> tuple[list[float], list[float], list[int]]:
    """(steps, losses, weights) of one curve of the digest: `train` (its bins) or `eval`."""
    if source == "eval":
        return [float(s) for s in d.eval_steps], list(d.eval_losses), [1] * len(d.eval_steps)
    return list(d.bin_steps), list(d.bin_losses), list(d.bin_counts)


def smoothed(d: CurveDigest, source: str) -> list[tuple[float, float]]:
    """The smoothed curve of one source: a count-weighted running mean of (step, loss) over 2h + 1 neighbours
    (h = TRAIN_SMOOTHING_BINS or EVAL_SMOOTHING_POINTS), truncated at the ends; nan where a neighbour is."""
    xs, ys, ws = raw_points(d, source)
    h = EVAL_SMOOTHING_POINTS if source == "eval" else TRAIN_SMOOTHING_BINS
    out = []
    for i in range(len(xs)):
        lo, hi = max(0, i - h), min(len(xs), i + h + 1)
        wsum = sum(ws[lo:hi])
        x = sum(ws[j] * xs[j] for j in range(lo, hi)) / wsum
        y = sum(ws[j] * ys[j] for j in range(lo, hi)) / wsum
        out.append((x, y))
    return out


def interpolate(curve: Sequence[tuple[float, float]], x: float) -> float:
    """Linear interpolation of a (step, loss) curve (steps increasing) at x; nan outside its steps."""
    if not curve or x < curve[0][0] or x > curve[-1][0]:
        return math.nan
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]
