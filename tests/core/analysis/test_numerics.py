"""The fp8-vs-bf16 loss verdict on synthetic curves (core.analysis.numerics; pure, milliseconds)."""

from __future__ import annotations

import math
import random

import pytest

from core.analysis.numerics import RunLosses, loss_verdict, short_verdict, window_steps


def _curve(
    run_id: str, seed: int, fn, steps: int, noise: float = 0.0, rng_seed: int = 0, eval_every: int = 0
) -> RunLosses:
    """A run whose loss at step t is fn(t) plus independent Gaussian noise of `noise` (absolute)."""
    rng = random.Random(rng_seed)
    losses = tuple(fn(t) + rng.gauss(0, noise) for t in range(steps))
    ev = [t for t in range(steps) if eval_every and ((t + 1) % eval_every == 0 or t == steps - 1)]
    return RunLosses(
        run_id=run_id,
        seed=seed,
        steps=tuple(range(steps)),
        losses=losses,
        eval_steps=tuple(ev),
        eval_losses=tuple(fn(t) for t in ev),
    )


def _flat(t: int) -> float:
    return 3.0


def test_window_is_a_quarter_up_to_50_steps():
    assert window_steps(1000) == 50
    assert window_steps(100) == 25
    assert window_steps(30) == 7


def test_falling_curve_is_inconclusive():
    # 200 steps of a curve still falling ~1% a step at the end: any gap is where the curve stopped
    def falling(t):
        return 2.0 + 8.0 * math.exp(-t / 150)

    bf16 = [_curve("b", 0, falling, 200, noise=0.01, rng_seed=1)]
    fp8 = [_curve("f", 0, lambda t: falling(t) * 1.05, 200, noise=0.01, rng_seed=2)]
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "inconclusive"
    assert v.reason.startswith("loss still falling")
    assert v.bf16_slope < 0 and v.fp8_slope < 0
    assert short_verdict(v) == "inconclusive: loss still falling"


def test_equal_curves_with_noise_track():
    seeds = (0, 1, 2)
    bf16 = [_curve(f"b{s}", s, _flat, 400, noise=0.02, rng_seed=10 + s) for s in seeds]
    fp8 = [_curve(f"f{s}", s, _flat, 400, noise=0.02, rng_seed=20 + s) for s in seeds]
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "tracks", v.reason
    assert abs(v.gap) <= v.band <= 0.01
    assert v.num_seeds == 3 and v.source == "train"
    assert (v.window_first_step, v.window_last_step, v.window_steps) == (350, 399, 50)
    assert short_verdict(v).startswith("tracks ")


def test_three_percent_offset_differs():
    seeds = (0, 1, 2)
    bf16 = [_curve(f"b{s}", s, _flat, 400, noise=0.02, rng_seed=10 + s) for s in seeds]
    fp8 = [_curve(f"f{s}", s, lambda t: 3.09, 400, noise=0.02, rng_seed=20 + s) for s in seeds]
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "differs", v.reason
    assert v.gap == pytest.approx(0.03, abs=0.003)
    assert v.band < 0.01


def test_noisy_short_run_is_inconclusive_not_tracks():
    # one seed, very noisy steps: the band is wider than the tolerance
    bf16 = [_curve("b", 0, _flat, 60, noise=0.3, rng_seed=1)]
    fp8 = [_curve("f", 0, _flat, 60, noise=0.3, rng_seed=2)]
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "inconclusive"
    assert v.reason.startswith("too noisy"), v.reason


def test_seed_spread_widens_the_band():
    # per-seed offsets of -1%, 0, +1%: each alone precise, together uncertain
    bf16 = [_curve(f"b{s}", s, _flat, 400) for s in (0, 1, 2)]
    fp8 = [_curve(f"f{s}", s, lambda t, s=s: 3.0 * (1 + 0.01 * (s - 1)), 400) for s in (0, 1, 2)]
    v = loss_verdict(fp8, bf16)
    assert v.gap == pytest.approx(0.0, abs=1e-12)
    assert v.band == pytest.approx(2 * 0.01 / math.sqrt(3), rel=1e-6)  # Z * stdev(gaps) / sqrt(S)


def test_too_few_steps_and_missing_bf16():
    short = loss_verdict([_curve("f", 0, _flat, 8)], [_curve("b", 0, _flat, 8)])
    assert short.verdict == "inconclusive" and short.reason.startswith("too few steps")
    assert short_verdict(short) == "inconclusive: too few steps"
    none = loss_verdict([_curve("f", 0, _flat, 100)], [])
    assert none.reason.startswith("bf16 missing")
    other_seed = loss_verdict([_curve("f", 1, _flat, 100)], [_curve("b", 0, _flat, 100)])
    assert other_seed.reason == "bf16 missing: no bf16 run with seed 1"


def test_eval_loss_preferred_when_every_run_has_it():
    # training loss differs by 3%, the held-out loss does not: the verdict uses the held-out loss
    bf16 = [_curve("b", 0, _flat, 400, eval_every=25)]
    fp8 = [
        RunLosses(
            run_id="f",
            seed=0,
            steps=tuple(range(400)),
            losses=(3.09,) * 400,
            eval_steps=bf16[0].eval_steps,
            eval_losses=tuple(3.0 + 0.001 * (i % 2) for i in range(len(bf16[0].eval_steps))),
        )
    ]
    v = loss_verdict(fp8, bf16)
    assert v.source == "eval"
    assert v.window_first_step == 300
    assert v.verdict == "tracks", v.reason
    without_eval = loss_verdict([RunLosses(run_id="f", seed=0, steps=tuple(range(400)), losses=(3.09,) * 400)], bf16)
    assert without_eval.source == "train" and without_eval.verdict == "differs"


def test_diverged_fp8_differs():
    bf16 = [_curve("b", 0, _flat, 100, noise=0.01)]
    fp8 = [_curve("f", 0, lambda t: math.nan if t > 90 else 3.0, 100)]
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "differs" and "not finite" in v.reason
    assert short_verdict(v) == "differs: fp8 loss is not finite in the window"


def test_numerics_metric_of_a_verdict():
    from core.analysis.regression import DEFAULT_METRICS, numerics_value

    assert (numerics_value("differs"), numerics_value("tracks"), numerics_value("inconclusive")) == (1.0, 0.0, None)
    assert DEFAULT_METRICS["numerics"].limit == 0.5 and not DEFAULT_METRICS["numerics"].higher_is_better
