"""Property-based: core.analysis.scaling and core.analysis.fits are total over the whole float range.

Every function gets any finite float (subnormals, 1e308 and the float maximum included; for the fits also
zero, negatives, NaN and infinities, and any N), and answers without raising: a fit is made or refused with a
reason, a report is built, its JSON is strict (no Infinity or NaN), and its CSV says what its JSON says (an
empty cell exactly where JSON has null, never `inf`). Fits are scale-free (normalised by the baseline): the
same series at 1e-300 or 1e300 tokens/s gives the same serial fraction, and a physically plausible series is
always fitted, whatever its scale.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from core.analysis.fits import (
    MAX_PER_DEVICE_SPAN,
    AmdahlParams,
    FitRefused,
    USLParams,
    amdahl_x,
    fit_amdahl,
    fit_quality,
    fit_usl,
    usl_x,
)
from core.analysis.scaling import (
    CSV_COLUMNS,
    RunPoint,
    aggregate_points,
    build_report,
    build_report_from_points,
    to_csv,
    to_csv_rows,
)

PROPS = settings(max_examples=150, deadline=None, derandomize=True, database=None)

FMAX = sys.float_info.max
EXTREMES = [FMAX, 1e308, 1e300, 1e155, 1e-160, 1e-300, sys.float_info.min, 5e-324, 1.0]
positive = st.one_of(st.sampled_from(EXTREMES), st.floats(min_value=5e-324, max_value=FMAX))
finite = st.one_of(positive, positive.map(lambda x: -x), st.just(0.0))
any_float = st.one_of(finite, st.floats(allow_nan=True, allow_infinity=True))
device_counts = st.integers(min_value=1, max_value=65536)


def _params_are_physical(p: AmdahlParams | USLParams | FitRefused) -> None:
    if isinstance(p, FitRefused):
        assert p.reason.startswith("not fitted: ")
        return
    q = p.quality
    assert all(v is None or math.isfinite(v) for v in (q.r_squared, q.rms_rel_error)), q
    if isinstance(p, AmdahlParams):
        assert math.isfinite(p.tokens_per_sec_one_device) and p.tokens_per_sec_one_device > 0, p
        assert 0.0 <= p.serial_fraction <= 1.0, p
    else:
        assert math.isfinite(p.lambda_tokens_per_sec) and p.lambda_tokens_per_sec > 0, p
        assert math.isfinite(p.sigma) and p.sigma >= 0 and math.isfinite(p.kappa) and p.kappa >= 0, p
        peak = p.peak_num_devices
        assert peak is None or (math.isfinite(peak) and peak > 0), p


# ------------------------------------------------------------------------------------------------ fits


@PROPS
@given(
    ns=st.lists(st.one_of(device_counts, st.integers(), st.floats()), max_size=8), xs=st.lists(any_float, max_size=8)
)
@example(ns=[1, 2, 4], xs=[1e155, 2e155, 4e155])  # the outside tester's OverflowError
@example(ns=[1, 2, 4], xs=[1e-160, 2e-160, 3e-160])  # ... and AssertionError
@example(ns=[1, 2, 4], xs=[1e308, 1.5e308, 1.7e308])  # ... and ZeroDivisionError
@example(ns=[1, 2, 4], xs=[5e-324, 1e-323, 2e-323])
@example(ns=[1, 2, 4], xs=[1e200, 1e-200, 1.0])
def test_fits_are_total(ns, xs) -> None:
    xs = xs[: len(ns)] if len(xs) >= len(ns) else xs  # equal lengths mostly; unequal ones are refused
    for fit in (fit_amdahl, fit_usl):
        _params_are_physical(fit(ns, xs))


@st.composite
def plausible_series(draw) -> tuple[list[int], list[float]]:
    """Distinct N with a per-device throughput within a factor of 1,000 of the baseline's, at any scale that keeps
    X finite: what a real (if strange) cluster measures."""
    ns = sorted(draw(st.sets(device_counts, min_size=3, max_size=8)))
    shape = draw(st.lists(st.floats(min_value=1e-3, max_value=1.0), min_size=len(ns), max_size=len(ns)))
    top = max(n * f for n, f in zip(ns, shape))
    limit = FMAX / top / 2
    scale = draw(
        st.one_of(
            st.sampled_from([5e-324, 1e-300, 1e-160, 1.0, 1e155, 1e300, limit]),
            st.floats(min_value=5e-324, max_value=limit),
        ).filter(lambda c: c <= limit)
    )
    xs = [scale * (n * f) for n, f in zip(ns, shape)]
    return ns, xs


@PROPS
@given(series=plausible_series())
def test_a_plausible_series_is_fitted_at_any_scale(series) -> None:
    ns, xs = series
    if any(x < sys.float_info.min * 1e6 for x in xs):  # subnormal: the per-device ratios lost their precision
        return _params_are_physical(fit_amdahl(ns, xs))
    per_device = [x / n for n, x in zip(ns, xs)]
    assert max(per_device) / min(per_device) < MAX_PER_DEVICE_SPAN
    for fit in (fit_amdahl, fit_usl):
        p = fit(ns, xs)
        if isinstance(p, FitRefused):  # where X1 would pass the float maximum, or a wild USL series collapses
            assert (
                "outside the float range" in p.reason
                and max(xs) > FMAX / 1e9
                or fit is fit_usl
                and "collapses" in p.reason
            ), (p, xs)
            continue
        _params_are_physical(p)
        # the fit predicts within the measured range without leaving the float range
        assert all(math.isfinite(p.predict(n)) for n in ns[:-1])


@st.composite
def scaling_curves(draw) -> tuple[list[int], list[float]]:
    """What a cluster measures: throughput that grows with N while efficiency falls (or holds), down to as low as
    0.05, within 1% noise, at any scale that keeps X(N) below 1e-9 of the float maximum."""
    ns = sorted(draw(st.sets(device_counts, min_size=3, max_size=8)))
    drops = draw(st.lists(st.floats(min_value=0.5, max_value=1.0), min_size=len(ns), max_size=len(ns)))
    noise = draw(st.lists(st.floats(min_value=-0.01, max_value=0.01), min_size=len(ns), max_size=len(ns)))
    eff, shape = 1.0, []
    for d, e in zip(drops, noise):
        eff = max(0.05, eff * d)
        shape.append(eff * (1 + e))
    assume(all(a * m < b * n for a, b, m, n in zip(shape, shape[1:], ns, ns[1:])))
    top = max(n * f for n, f in zip(ns, shape))
    limit = FMAX / top / 1e9
    scale = draw(
        st.one_of(
            st.sampled_from([5e-324, 1e-300, 1e-160, 1.0, 1e155, 1e290, limit]),
            st.floats(min_value=5e-324, max_value=limit),
        ).filter(lambda c: c <= limit)
    )
    return ns, [scale * (n * f) for n, f in zip(ns, shape)]


@PROPS
@given(series=scaling_curves())
def test_a_scaling_curve_is_always_fitted(series) -> None:
    ns, xs = series
    if min(xs) < sys.float_info.min:  # subnormal: 1 to 52 bits of precision left, a fit may well refuse
        return
    for fit in (fit_amdahl, fit_usl):
        p = fit(ns, xs)
        assert not isinstance(p, FitRefused), (p, ns, xs)
        _params_are_physical(p)


@PROPS
@given(series=plausible_series(), exponent=st.sampled_from([-1000, -500, -100, -10, 10, 100, 500, 1000]))
def test_fits_are_scale_free(series, exponent) -> None:
    """X(N) times 2**k (exact in binary) gives X1 times 2**k and the same s, sigma, kappa, bit for bit: the fit
    sees X(N) / X(N0) only."""
    ns, xs = series
    scale = 2.0**exponent
    scaled = [x * scale for x in xs]
    if any(not (sys.float_info.min * 1e12 < v < FMAX / 1e12) for v in xs + scaled):  # exact among normal floats
        return
    a, b = fit_amdahl(ns, xs), fit_amdahl(ns, scaled)
    if isinstance(a, FitRefused):
        return
    assert (b.tokens_per_sec_one_device, b.serial_fraction) == (a.tokens_per_sec_one_device * scale, a.serial_fraction)
    u, v = fit_usl(ns, xs), fit_usl(ns, scaled)
    if isinstance(u, FitRefused):
        assert v == u
        return
    assert (v.lambda_tokens_per_sec, v.sigma, v.kappa) == (u.lambda_tokens_per_sec * scale, u.sigma, u.kappa)
    assert (a.quality, u.quality) == (b.quality, v.quality)


@PROPS
@given(
    n=st.one_of(device_counts, st.floats(min_value=1.0, max_value=2.0**24)),
    x1=positive,
    s=st.floats(min_value=0.0, max_value=1.0),
    sigma=st.floats(min_value=0.0, max_value=1e6),
    kappa=st.floats(min_value=0.0, max_value=1e6),
)
def test_model_curves_never_raise_nor_overflow_before_their_answer(n, x1, s, sigma, kappa) -> None:
    """X1 * N may overflow where X1 * N / (1 + s (N - 1)) does not: the speed-up is taken first."""
    a = amdahl_x(n, x1, s)
    assert a > 0 and (math.isfinite(a) or x1 * (n / (1 + s * (n - 1))) == math.inf)
    assert a <= x1 * n * (1 + 1e-12) or x1 * n == math.inf
    u = usl_x(n, x1, sigma, kappa)
    assert u >= 0 and not math.isnan(u)


@PROPS
@given(
    xs=st.lists(finite, min_size=1, max_size=6),
    predicted=st.lists(any_float, min_size=6, max_size=6),
    noise=st.floats(min_value=-0.5, max_value=0.5),
)
def test_fit_quality_never_raises_and_is_finite_where_the_fit_is(xs, predicted, noise) -> None:
    fit_quality(range(1, len(xs) + 1), xs, predicted[: len(xs)], num_params=2)
    fitted = [x * (1 + noise) for x in xs]
    if all(x > 0 for x in xs) and all(map(math.isfinite, fitted)):  # at any scale, 1e308 and 5e-324 included
        q = fit_quality(range(1, len(xs) + 1), xs, fitted, num_params=2)
        assert math.isfinite(q.rms_rel_error) and (q.r_squared is None or math.isfinite(q.r_squared)), q


# --------------------------------------------------------------------------------------------- reports


runs_st = st.lists(
    st.builds(
        RunPoint,
        run_id=st.integers(0, 10**6),
        model=st.just("8b"),
        num_layers=st.just(16),
        precision=st.sampled_from(["bf16", "fp8-tensorwise"]),
        layout=st.sampled_from(["fsdp", "tp=2+fsdp"]),
        scaling=st.sampled_from(["weak", "strong"]),
        cluster=st.just("h200"),
        num_devices=st.sampled_from([1, 2, 4, 8, 64, 1024]),
        status=st.sampled_from(["succeeded", "succeeded", "failed", "running"]),
        tokens_per_sec=st.one_of(st.none(), any_float),
        step_ms_median=st.one_of(st.none(), any_float),
        mfu_vs_bf16_peak=st.one_of(st.none(), finite),
        peak_memory_allocated_gib=st.one_of(st.none(), finite),
        final_loss=st.one_of(st.none(), any_float),
        engine=st.sampled_from(["scalebench", "torchtitan"]),
    ),
    max_size=14,
)


def _strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@PROPS
@given(
    runs=runs_st,
    baseline=st.one_of(st.none(), st.sampled_from([1, 2, 8])),
    full_size=st.one_of(st.none(), device_counts, st.just(2**24)),
)
@example(
    runs=[
        RunPoint(
            run_id=i,
            model="8b",
            num_layers=16,
            precision=p,
            layout="fsdp",
            scaling="weak",
            cluster="h200",
            num_devices=n,
            status="succeeded",
            tokens_per_sec=(1e155 if p == "bf16" else 1e-160) * n,
        )
        for i, (p, n) in enumerate((p, n) for p in ("bf16", "fp8-tensorwise") for n in (1, 2, 4))
    ],
    baseline=None,
    full_size=1024,
)
def test_any_runs_give_a_report_whose_json_is_strict_and_whose_csv_agrees(runs, baseline, full_size) -> None:
    report = build_report(
        runs, baseline_num_devices=baseline, full_size_by_cluster={"h200": full_size} if full_size else None
    )
    again = build_report_from_points(
        aggregate_points(runs),
        baseline_num_devices=baseline,
        full_size_by_cluster={"h200": full_size} if full_size else None,
    )
    assert again.model_dump_json() == report.model_dump_json()
    data = _strict_json(report.model_dump_json())
    for s in report.series:
        for fit in (s.amdahl, s.usl):
            assert fit.fitted or fit.reason, fit
            if fit.at_full_size is not None:  # a curve fit within the measured range, never outside it
                assert math.isfinite(fit.at_full_size.tokens_per_sec)
                measured = [p.num_devices for p in s.points if p.tokens_per_sec]
                assert min(measured) <= fit.at_full_size.num_devices <= max(measured)
    text = to_csv(report)
    assert "inf" not in text.lower().replace("info", "") and "nan" not in text.lower()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(to_csv_rows(report)) == sum(len(s["points"]) for s in data["series"])
    json_points = [(s["key"], p) for s in data["series"] for p in s["points"]]
    for row, (key, p) in zip(rows, json_points):
        for column in CSV_COLUMNS:
            value = p.get(column, key.get(column))
            if column != "flags" and (column in p or column in key):
                assert (row[column] == "") == (value is None), (column, row[column], value)
