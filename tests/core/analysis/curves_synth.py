"""Synthetic loss curves with the noise of real ones, for the numerics and time-to-loss tests.

Real paired runs (bench/results/2026-12-04-numerics-h200.json) show two kinds of step noise: the batch's own
difficulty, large (tens of % of the loss step to step) and the same for fp8 and bf16 of one seed (same
batches), and the noise of the run itself, ~1.5% of the loss for the paired difference. Both are here.
"""

from __future__ import annotations

import math
import random

from core.analysis.numerics import RunLosses

BATCH_NOISE = 0.25  # relative, shared by the runs of one seed
OWN_NOISE = 0.015  # relative, each run its own


def falling(t: float) -> float:
    """A loss still falling at step 1,000 (~1% per 50 steps there), as at constant LR."""
    return 2.0 + 10.0 / math.sqrt(t + 10)


def run(
    run_id: str,
    seed: int,
    fn,
    steps: int,
    *,
    own_seed: int,
    batch_noise: float = BATCH_NOISE,
    own_noise: float = OWN_NOISE,
    eval_every: int = 0,
) -> RunLosses:
    batch = random.Random(1000 + seed)
    own = random.Random(own_seed)
    losses = tuple(
        fn(t) * (1 + batch_noise * batch.gauss(0, 1)) * (1 + own_noise * own.gauss(0, 1)) for t in range(steps)
    )
    ev = [t for t in range(steps) if eval_every and (t + 1) % eval_every == 0]
    return RunLosses(
        run_id=run_id,
        seed=seed,
        steps=tuple(range(steps)),
        losses=losses,
        eval_steps=tuple(ev),
        eval_losses=tuple(fn(t) * (1 + 0.002 * own.gauss(0, 1)) for t in ev),
    )


def pairs(fp8_fn, bf16_fn, steps: int, seeds=(0, 1, 2), **kw) -> tuple[list[RunLosses], list[RunLosses]]:
    fp8 = [run(f"f{s}", s, fp8_fn, steps, own_seed=20 + s, **kw) for s in seeds]
    bf16 = [run(f"b{s}", s, bf16_fn, steps, own_seed=10 + s, **kw) for s in seeds]
    return fp8, bf16
