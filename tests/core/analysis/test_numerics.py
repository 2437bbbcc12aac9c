"""The fp8-vs-bf16 loss verdict on synthetic curves with realistic noise (core.analysis.numerics; pure, ms)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from core.analysis.numerics import SEED_GAP_ALLOWANCE, RunLosses, loss_verdict, short_verdict
from tests.core.analysis.curves_synth import falling, pairs

RECORDED = Path(__file__).resolve().parents[3] / "bench/results/2026-12-04-numerics-h200.json"


def test_late_divergence_differs():
    # fp8 equal to bf16 for 900 of 1,000 steps, then 5% worse
    fp8, bf16 = pairs(lambda t: falling(t) * (1.05 if t >= 900 else 1.0), falling, 1000)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "differs", v.reason
    assert v.gap > 0.03
    one = loss_verdict(fp8[:1], bf16[:1])  # one seed: the allowance widens the band, still outside it
    assert one.verdict == "differs", one.reason
    assert one.seed_allowance == SEED_GAP_ALLOWANCE["train"]


def test_parallel_falling_curves_two_percent_apart_differ():
    fp8, bf16 = pairs(lambda t: falling(t) * 1.02, falling, 1000)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "differs", v.reason
    assert v.gap == pytest.approx(0.02, abs=0.005)
    assert v.bf16_slope < 0 and v.fp8_slope < 0  # still falling, and concluded
    assert short_verdict(v) == f"differs {v.gap:+.1%} ±{v.band:.1%}"


def test_parallel_falling_curves_a_tenth_of_a_percent_apart_track():
    fp8, bf16 = pairs(lambda t: falling(t) * 1.001, falling, 1000)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "tracks", v.reason
    assert abs(v.gap) <= v.band <= 0.01
    assert v.num_seeds == 3 and v.source == "train"
    assert (v.window_first_step, v.window_last_step) == (750, 999)


def test_one_seed_does_not_claim_tracks():
    fp8, bf16 = pairs(lambda t: falling(t) * 1.001, falling, 1000, seeds=(0,))
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "inconclusive", v.reason
    assert "more seeds" in v.reason
    assert v.band >= 2 * SEED_GAP_ALLOWANCE["train"]


def test_eval_loss_is_preferred_and_one_seed_can_track_on_it():
    fp8, bf16 = pairs(lambda t: falling(t) * 1.001, falling, 1000, seeds=(0,), eval_every=50)
    v = loss_verdict(fp8, bf16)
    assert v.source == "eval"
    assert v.verdict == "tracks", v.reason
    assert v.seed_allowance == SEED_GAP_ALLOWANCE["eval"]


def test_a_gap_still_moving_is_inconclusive_with_what_would_help():
    # fp8 catching up over the last quarter: 2.5% behind at step 750, 0.5% at the end, and still moving
    fp8, bf16 = pairs(lambda t: falling(t) * (1.025 - 0.02 * max(0.0, t - 750) / 250), falling, 1000)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "inconclusive", v.reason
    assert v.reason.startswith("gap still moving")
    assert "lr_schedule: cosine" in v.reason
    assert -v.gap_drift > v.gap_drift_band


def test_a_lag_of_a_few_steps_closes_and_is_not_differs():
    # fp8 = bf16 delayed by 60 steps on a steep curve: a gap that closes as the curve flattens
    steep = lambda t: 2.0 + 8.0 * math.exp(-t / 200)  # noqa: E731
    fp8, bf16 = pairs(lambda t: steep(max(0.0, t - 60)), steep, 900, batch_noise=0.0, own_noise=0.002)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "inconclusive", v.reason
    assert v.reason.startswith(("gap still closing", "gap still moving"))


def test_fp8_divergence_in_the_window_differs():
    fp8, bf16 = pairs(lambda t: math.nan if t > 950 else falling(t), falling, 1000)
    v = loss_verdict(fp8, bf16)
    assert v.verdict == "differs"
    assert "not finite" in v.reason


def test_missing_and_short():
    fp8, bf16 = pairs(falling, falling, 1000)
    assert loss_verdict(fp8, []).reason.startswith("bf16 missing")
    assert loss_verdict([], bf16).reason == "no fp8 loss curve"
    short_f, short_b = pairs(falling, falling, 20)
    v = loss_verdict(short_f, short_b)
    assert v.verdict == "inconclusive" and v.reason.startswith("too few steps") and "more steps" in v.reason
    with pytest.raises(ValueError, match="tolerance"):
        loss_verdict(fp8, bf16, tolerance=0)


def test_digests_give_the_same_verdict_as_the_curves():
    fp8, bf16 = pairs(lambda t: falling(t) * 1.02, falling, 1000)
    a = loss_verdict(fp8, bf16)
    b = loss_verdict([r.digest() for r in fp8], [r.digest() for r in bf16])
    assert a == b


def _recorded_runs(recipe: str, source: str) -> list[RunLosses]:
    data = json.loads(RECORDED.read_text())
    out = []
    for seed, c in data["curves"][recipe].items():
        ev = c["eval"] if source == "eval" else []
        out.append(
            RunLosses(
                run_id=f"{recipe}/{seed}",
                seed=int(seed),
                steps=tuple(range(len(c["loss"]))),
                losses=tuple(c["loss"]),
                eval_steps=tuple(e["step"] for e in ev),
                eval_losses=tuple(e["loss"] for e in ev),
            )
        )
    return out


@pytest.mark.parametrize("source", ["eval", "train"])
def test_seed_allowance_is_the_recorded_seed_spread(source):
    """SEED_GAP_ALLOWANCE: the pooled standard deviation, between seeds, of the end gaps of the recorded real
    runs (three fp8 recipes against bf16, seeds 0-2), rounded up to the next 0.1%."""
    bf16 = _recorded_runs("bf16", source)
    devs = []
    for recipe in ("fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp"):
        fp8 = _recorded_runs(recipe, source)
        gaps = [loss_verdict([f], [b], seed_allowance=0.0).gap for f, b in zip(fp8, bf16)]
        assert all(g is not None for g in gaps)
        devs += [g - statistics.fmean(gaps) for g in gaps]
    pooled = math.sqrt(sum(d * d for d in devs) / (len(devs) - 3))
    assert SEED_GAP_ALLOWANCE[source] == pytest.approx(math.ceil(pooled * 1000) / 1000)
