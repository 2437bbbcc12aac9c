"""Time to the same loss on synthetic curves (core.analysis.time_to_loss; pure, ms)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.curves import digest_curve
from core.analysis.time_to_loss import first_reach, short_effective, time_to_loss
from tests.core.analysis.curves_synth import falling, pairs

# the step noise of a real-text corpus seen less than twice (a small corpus memorized shows ~25%: no crossing
# step is sharp then, and the band says so)
BATCH = 0.03


def test_fp8_ten_percent_slower_per_step_is_extrapolated_past_its_end():
    # fp8 reaches at step 1.1 t the loss bf16 reaches at t: in a run of the same length it falls short of
    # bf16's end loss; the crossing is extrapolated (a lower bound) and the earlier checkpoints measure it
    fp8, bf16 = pairs(lambda t: falling(t / 1.1), falling, 1000, own_noise=0.005, batch_noise=BATCH)
    t = time_to_loss(fp8, bf16, speedup=1.3)
    assert t.extrapolated and 0 < t.shortfall < 0.02 and "extrapolated past fp8's end" in t.reason
    assert 1.05 < t.steps_ratio <= 1.1 + t.steps_ratio_band
    assert short_effective(t).startswith("~")
    assert [m.fraction for m in t.matches] == [0.25, 0.5, 0.75, 0.9, 1.0]
    assert all(m.steps_ratio == pytest.approx(1.1, abs=0.05) for m in t.matches[1:4])
    assert t.matches[-1].fp8_step is None  # not reached within the run


def test_fp8_far_behind_is_null_with_its_shortfall():
    fp8, bf16 = pairs(lambda t: falling(t / 1.6), falling, 1000, own_noise=0.005, batch_noise=BATCH)
    t = time_to_loss(fp8, bf16, speedup=1.3)
    assert t.steps_ratio is None and t.effective_speedup is None and not t.extrapolated
    assert t.shortfall > 0.02 and "never reached" in t.reason


def test_fp8_ten_percent_faster_per_step():
    # fp8 reaches at step 0.9 t the loss bf16 reaches at t
    fp8, bf16 = pairs(lambda t: falling(t / 0.9), falling, 1000, own_noise=0.005, batch_noise=BATCH)
    t = time_to_loss(fp8, bf16, speedup=1.3, fp8_step_ms=100.0, bf16_step_ms=130.0, fp8_tokens_per_step=8192)
    assert abs(t.steps_ratio - 0.9) <= t.steps_ratio_band < 0.1, t.reason
    assert t.effective_speedup == pytest.approx(1.3 / t.steps_ratio) and t.effective_speedup > 1.3
    assert t.effective_speedup_band == pytest.approx(t.effective_speedup * t.steps_ratio_band / t.steps_ratio)
    assert t.fp8_time_s == pytest.approx(t.fp8_steps * 0.1)
    assert t.bf16_time_s == pytest.approx(t.bf16_steps * 0.13)
    assert t.fp8_tokens == pytest.approx(t.fp8_steps * 8192)
    assert t.bf16_tokens is None
    assert all(m.steps_ratio == pytest.approx(0.9, abs=0.05) for m in t.matches[1:4])
    assert short_effective(t).startswith(f"{t.effective_speedup:.2f}x ±")


def test_fp8_that_never_reaches_says_by_how_much():
    flat = lambda t: 2.0 + 3.0 * math.exp(-t / 100)  # noqa: E731  flat at the end: 3% worse never catches up
    fp8, bf16 = pairs(lambda t: flat(t) * 1.03, flat, 1000)
    t = time_to_loss(fp8, bf16, speedup=1.2)
    assert t.steps_ratio is None and t.effective_speedup is None
    assert t.shortfall == pytest.approx(0.03, abs=0.01)
    assert "never reached" in t.reason and "short by" in t.reason
    assert short_effective(t) == f"short {t.shortfall:.1%}"


def test_one_seed_band_has_the_allowance():
    fp8, bf16 = pairs(falling, falling, 1000, seeds=(0,))
    t = time_to_loss(fp8, bf16, speedup=1.1)
    assert t.seed_allowance is not None and t.seed_allowance > 0
    assert t.steps_ratio_band >= 2 * t.seed_allowance
    assert "one seed" in t.reason


def test_eval_loss_is_preferred():
    fp8, bf16 = pairs(lambda t: falling(t / 0.95), falling, 1000, eval_every=50, batch_noise=BATCH)
    t = time_to_loss(fp8, bf16, speedup=1.0)
    assert t.source == "eval"
    assert t.steps_ratio == pytest.approx(0.95, abs=0.03), t.reason


def test_missing_curves():
    fp8, bf16 = pairs(falling, falling, 100)
    assert time_to_loss(fp8, [], speedup=1.0).reason == "no bf16 loss curve"
    assert time_to_loss([], bf16, speedup=1.0).reason == "no fp8 loss curve"


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(0.01, 10.0), min_size=2, max_size=40),
    st.floats(0.0, 12.0),
)
def test_first_reach_is_where_the_curve_first_gets_there(ys, target):
    curve = [(float(i), y) for i, y in enumerate(sorted(ys, reverse=True))]
    x = first_reach(curve, target)
    if target < curve[-1][1]:
        assert x is None
    else:
        assert x is not None and 0 <= x <= len(ys) - 1
        i = math.ceil(x)
        assert curve[i][1] <= target + 1e-9


@settings(max_examples=20, deadline=None)
@given(st.floats(0.8, 1.25), st.integers(200, 2000))
def test_a_time_stretched_curve_gives_its_stretch(stretch, steps):
    def fn(t):
        return 2.0 + 10.0 / math.sqrt(t / stretch + 10)

    fp8 = [digest_curve([(t, fn(t)) for t in range(steps)], seed=0)]
    bf16 = [digest_curve([(t, falling(t)) for t in range(steps)], seed=0)]
    t = time_to_loss(fp8, bf16, speedup=1.0)
    if not t.extrapolated and t.steps_ratio is not None:
        assert t.steps_ratio == pytest.approx(stretch, rel=0.03)
    elif t.extrapolated:  # past fp8's end: a lower bound, close for a short extrapolation
        assert stretch * 0.93 <= t.steps_ratio <= stretch * 1.03
    else:
        assert t.shortfall > 0 and stretch > 1.15


def test_a_shortfall_below_the_cells_resolution_is_not_printed_as_zero():
    t = time_to_loss(*pairs(lambda t: falling(t) * 1.03, falling, 1000), speedup=1.2)
    assert short_effective(t.model_copy(update={"shortfall": 8e-5})) == "short <0.1%"
    assert short_effective(t.model_copy(update={"shortfall": 0.0012})) == "short 0.1%"
