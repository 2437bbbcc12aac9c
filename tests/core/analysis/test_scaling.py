"""core.analysis.scaling and core.analysis.fits: X(N), E(N), S(N), flags, fits, CSV. Table-driven, milliseconds each."""

import math
import random
import time

import pytest

from core.analysis.fits import FitRefused, amdahl_x, fit_amdahl, fit_usl, usl_x
from core.analysis.scaling import CSV_COLUMNS, RunPoint, ScalingReport, build_report, to_csv, to_csv_rows

_ids = iter(range(10**9))


def run(n, x, precision="bf16", layout="fsdp", cluster="h200", status="succeeded", **kw):
    return RunPoint(
        run_id=next(_ids),
        model="8b",
        num_layers=16,
        precision=precision,
        layout=layout,
        scaling=kw.pop("scaling", "weak"),
        cluster=cluster,
        num_devices=n,
        status=status,
        tokens_per_sec=x if status == "succeeded" else None,
        **kw,
    )


def series(report, precision="bf16", layout="fsdp", cluster="h200", scaling="weak"):
    (s,) = [
        s
        for s in report.series
        if (s.key.precision, s.key.layout, s.key.cluster, s.key.scaling) == (precision, layout, cluster, scaling)
    ]
    return s


def point(report, n, **kw):
    (p,) = [p for p in series(report, **kw).points if p.num_devices == n]
    return p


# ------------------------------------------------------------------------------------------ efficiency

# Per-device tokens/s by N, and E(N) in percent computed by hand (E = per-device X(N) / per-device X(N0)).
WEAK_TABLES = {
    # constructed from a formula: E(N) = 1 / (1 + 0.02 log2(N / 8))
    "formula": (
        {8: 1000.0, 16: 1000 / 1.02, 32: 1000 / 1.04, 64: 1000 / 1.06, 128: 1000 / 1.08},
        {8: 100.0, 16: 98.039, 32: 96.154, 64: 94.340, 128: 92.593},
    ),
    # realistic-looking Llama-3-8B FSDP numbers (constructed, irregular, with a superlinear blip at 16)
    "realistic": (
        {8: 5762.0, 16: 5790.0, 32: 5485.0, 64: 5291.0, 256: 4620.0},
        {8: 100.0, 16: 100.486, 32: 95.193, 64: 91.826, 256: 80.180},
    ),
}


@pytest.mark.parametrize("name", WEAK_TABLES)
def test_weak_scaling_efficiency_matches_hand_values(name):
    per_device, expected_pct = WEAK_TABLES[name]
    report = build_report([run(n, x * n) for n, x in per_device.items()])
    s = series(report)
    assert s.baseline_num_devices == 8
    for p in s.points:
        assert p.tokens_per_sec_per_device == pytest.approx(per_device[p.num_devices])
        assert 100 * p.efficiency == pytest.approx(expected_pct[p.num_devices], abs=0.001)


def test_baseline_num_devices_asked_for():
    runs = [run(n, 1000.0 * n * f) for n, f in {4: 1.1, 8: 1.0, 16: 0.9}.items()]
    s = series(build_report(runs, baseline_num_devices=8))
    assert s.baseline_num_devices == 8
    assert [round(p.efficiency, 6) for p in s.points] == [1.1, 1.0, 0.9]
    s = series(build_report([r for r in runs if r.num_devices != 8], baseline_num_devices=8))
    assert s.baseline_num_devices is None and all(p.efficiency is None for p in s.points)
    assert "baseline N0=8 was not measured" in s.notes[0]


# -------------------------------------------------------------------------------------- repeats, flags


@pytest.mark.parametrize(
    "xs, median, spread, noisy",
    [
        ([100.0, 101.0, 102.0], 101.0, 2 / 101, False),
        ([100.0, 102.0, 110.0], 102.0, 10 / 102, True),
        ([100.0, 104.0], 102.0, 4 / 102, False),
        ([100.0], 100.0, 0.0, False),
    ],
)
def test_repeats_median_and_spread(xs, median, spread, noisy):
    p = point(build_report([run(8, x) for x in xs]), 8)
    assert p.tokens_per_sec == pytest.approx(median) and p.spread == pytest.approx(spread)
    assert p.num_succeeded == len(xs) and ("noisy" in p.flags) is noisy
    assert (p.tokens_per_sec_min, p.tokens_per_sec_max) == (min(xs), max(xs))


def test_failed_partial_and_pending_points():
    runs = [
        run(8, 800.0),
        run(8, 810.0, mfu_vs_bf16_peak=0.4),
        run(16, 1600.0),
        run(16, None, status="failed"),
        run(32, None, status="failed"),
        run(32, None, status="failed"),
        run(64, None, status="running"),
    ]
    r = build_report(runs)
    assert point(r, 8).mfu_vs_bf16_peak == 0.4  # median over repeats that report it
    p16, p32, p64 = point(r, 16), point(r, 32), point(r, 64)
    assert p16.status == "measured" and "some_failed" in p16.flags and p16.num_failed == 1
    assert p32.status == "failed" and p32.flags == ["failed"] and p32.num_failed == 2
    assert p32.tokens_per_sec is None and p32.efficiency is None
    assert p64.status == "pending" and p64.num_pending == 1


def test_missing_points_and_layouts_that_cannot_run_there():
    runs = [run(n, 100.0 * n) for n in (8, 16, 32)]
    runs += [run(n, 90.0 * n, precision="fp8-rowwise") for n in (8, 32)]
    runs += [run(8, 700.0, layout="tp=8")]
    r = build_report(runs)
    p = point(r, 16, precision="fp8-rowwise")
    assert p.status == "missing" and p.flags == ["missing"] and p.num_succeeded == 0
    tp8 = series(r, layout="tp=8")
    assert [p.num_devices for p in tp8.points] == [8]  # tp=8 runs only on 8 devices: not "missing" elsewhere
    assert "cannot run at N=16, 32" in tp8.notes[0]


def test_imported_flag_and_series_grouping():
    runs = [run(8, 800.0, imported=True), run(8, 700.0, cluster="mi300x"), run(8, 900.0, scaling="strong")]
    r = build_report(runs)
    assert len(r.series) == 3 and r.gpu_counts == [8]
    assert "imported" in point(r, 8).flags
    assert "imported" not in point(r, 8, cluster="mi300x").flags
    assert point(r, 8, scaling="strong").tokens_per_sec == 900.0


# ------------------------------------------------------------------------------------------- speedups


def test_speedup_pairs_same_layout_cluster_and_n():
    runs = [
        run(8, 1000.0, final_loss=3.00),
        run(16, 1900.0),
        run(8, 1150.0, precision="fp8-tensorwise", final_loss=3.03),
        run(16, 2280.0, precision="fp8-tensorwise"),
        run(8, 1200.0, precision="fp8-rowwise", layout="tp=2+fsdp"),  # no bf16 with this layout
        run(8, 1300.0, precision="fp8-rowwise", cluster="mi300x"),
    ]  # no bf16 on this cluster
    r = build_report(runs)
    assert {(s.precision, s.num_devices): round(s.speedup, 6) for s in r.speedups} == {
        ("fp8-tensorwise", 8): 1.15,
        ("fp8-tensorwise", 16): 1.2,
    }
    (s8,) = [s for s in r.speedups if s.num_devices == 8]
    assert s8.loss_rel_gap == pytest.approx(0.01)
    assert point(r, 16, precision="fp8-tensorwise").fp8_speedup == pytest.approx(1.2)
    assert point(r, 8).fp8_speedup is None  # bf16 itself
    assert point(r, 8, precision="fp8-rowwise", layout="tp=2+fsdp").fp8_speedup is None


# ----------------------------------------------------------------------------------------------- fits

POW2 = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize("x1, s", [(1000.0, 0.0), (1000.0, 0.01), (5000.0, 0.05), (800.0, 0.3)])
def test_amdahl_recovers_exact_parameters(x1, s):
    fit = fit_amdahl(POW2[:6], [amdahl_x(n, x1, s) for n in POW2[:6]])
    assert fit.tokens_per_sec_one_device == pytest.approx(x1, rel=1e-6)
    assert fit.serial_fraction == pytest.approx(s, abs=1e-7)
    assert fit.quality.rms_rel_error < 1e-6


@pytest.mark.parametrize(
    "lam, sigma, kappa", [(1000.0, 0.02, 1e-4), (2000.0, 0.0, 5e-5), (500.0, 0.05, 0.0), (1000.0, 0.1, 1e-3)]
)
def test_usl_recovers_exact_parameters(lam, sigma, kappa):
    fit = fit_usl(POW2, [usl_x(n, lam, sigma, kappa) for n in POW2])
    assert fit.lambda_tokens_per_sec == pytest.approx(lam, rel=1e-6)
    assert fit.sigma == pytest.approx(sigma, abs=1e-7) and fit.kappa == pytest.approx(kappa, abs=1e-9)
    assert fit.quality.r_squared == pytest.approx(1.0)
    peak = math.sqrt((1 - sigma) / kappa) if kappa > 0 else None
    assert fit.peak_num_devices == (pytest.approx(peak, rel=1e-5) if peak else None)


@pytest.mark.parametrize("seed", range(5))
def test_fits_with_one_percent_noise(seed):
    rng = random.Random(seed)
    noisy = lambda x: x * (1 + rng.gauss(0, 0.01))  # noqa: E731
    usl = fit_usl(POW2, [noisy(usl_x(n, 1000.0, 0.02, 1e-4)) for n in POW2])
    assert usl.lambda_tokens_per_sec == pytest.approx(1000.0, rel=0.03)
    assert usl.sigma == pytest.approx(0.02, abs=0.005) and usl.kappa == pytest.approx(1e-4, rel=0.2)
    assert usl.peak_num_devices == pytest.approx(99.0, rel=0.1) and usl.quality.rms_rel_error < 0.02
    amdahl = fit_amdahl(POW2, [noisy(amdahl_x(n, 1000.0, 0.03)) for n in POW2])
    assert amdahl.serial_fraction == pytest.approx(0.03, abs=0.002)
    assert amdahl.tokens_per_sec_one_device == pytest.approx(1000.0, rel=0.02)


def test_superlinear_data_fits_at_the_bounds_without_a_peak():
    fit = fit_usl([8, 16, 32, 64], [8000.0, 16300.0, 32900.0, 66000.0])
    assert fit.sigma == 0.0 and fit.kappa == 0.0 and fit.peak_num_devices is None


@pytest.mark.parametrize("counts", [[8], [8, 16], [8, 16, 16]])
def test_refuses_to_fit_fewer_than_three_points(counts):
    s = series(build_report([run(n, 100.0 * n) for n in counts]))
    for fit in (s.amdahl, s.usl):
        assert not fit.fitted and fit.reason.startswith("not fitted: fewer than 3 points")
        assert fit.at_full_size is None
    refused = fit_usl(counts, [100.0 * n for n in counts])
    assert isinstance(refused, FitRefused) and "fewer than 3 points" in refused.reason


USL_8_TO_64 = {n: usl_x(n, 1000.0, 0.02, 1e-4) for n in (8, 16, 32, 64)}  # peaks at N* = sqrt(0.98 / 1e-4) = 99


@pytest.mark.parametrize("full_n", [8, 32, 64])
def test_fit_value_at_full_size_within_the_measured_range_is_a_curve_fit(full_n):
    runs = [run(n, x) for n, x in USL_8_TO_64.items()]
    s = series(build_report(runs, full_size_by_cluster={"h200": full_n}))
    for fit in (s.amdahl, s.usl):
        assert fit.fitted and fit.at_full_size is not None and fit.at_full_size.num_devices == full_n
        assert fit.at_full_size.note == f"curve fit at N={full_n}, within the measured range 8..64"
    e = usl_x(full_n, 1000.0, 0.02, 1e-4) / (USL_8_TO_64[8] * full_n / 8)
    assert s.usl.at_full_size.efficiency == pytest.approx(e, rel=1e-5)
    assert not any("projection" in n for n in s.notes)


@pytest.mark.parametrize("full_n", [1024, 65, 4])
def test_no_fit_value_outside_the_measured_range_the_notes_point_to_the_projection(full_n):
    runs = [run(n, x) for n, x in USL_8_TO_64.items()]
    s = series(build_report(runs, full_size_by_cluster={"h200": full_n}))
    for fit in (s.amdahl, s.usl):
        assert fit.fitted and fit.at_full_size is None
    (note,) = [n for n in s.notes if "projection" in n]
    assert note.startswith(f"N={full_n} is outside the measured range 8..64: the Amdahl/USL fits describe")
    assert "80% interval (GET /experiments/{id}/projection)" in note


def test_without_a_full_size_no_fit_value_and_no_note():
    s = series(build_report([run(n, x) for n, x in USL_8_TO_64.items()]))
    assert s.amdahl.at_full_size is None and s.usl.at_full_size is None
    assert not any("projection" in n for n in s.notes)


def test_imported_h200_series_has_no_fit_value_at_1024_anywhere():
    """The issue's case: 8 -> 64 GPUs with E(64) = 96%; the report at full size 1024 holds no value at N=1024 (the
    projection is the one prediction there), and the USL peak beyond the measured range is not given either."""
    per_device = {8: 1000.0, 16: 990.0, 32: 975.0, 64: 960.0}
    runs = [run(n, x * n, imported=True) for n, x in per_device.items()]
    report = build_report(runs, full_size_by_cluster={"h200": 1024})
    s = series(report)
    assert point(report, 64).efficiency == pytest.approx(0.96)
    assert s.amdahl.fitted and s.usl.fitted

    def values_at(obj, n):
        if isinstance(obj, dict):
            hit = [obj] if obj.get("num_devices") == n or obj.get("peak_num_devices") == n else []
            return hit + [v for x in obj.values() for v in values_at(x, n)]
        return [v for x in obj for v in values_at(x, n)] if isinstance(obj, list) else []

    assert values_at(report.model_dump(), 1024) == []
    peak = s.usl.peak_num_devices
    assert peak is None or 8 <= peak <= 64
    assert "extrapolat" not in report.model_dump_json()


@pytest.mark.parametrize("counts, in_range", [((8, 16, 32, 64), False), ((8, 16, 32, 64, 128, 256), True)])
def test_usl_peak_given_only_within_the_measured_range(counts, in_range):
    s = series(build_report([run(n, usl_x(n, 1000.0, 0.02, 1e-4)) for n in counts]))
    assert s.usl.peak_in_measured_range is in_range
    if in_range:
        assert s.usl.peak_num_devices == pytest.approx(99.0, rel=1e-4)
        assert s.usl.peak_tokens_per_sec == pytest.approx(usl_x(99.0, 1000.0, 0.02, 1e-4), rel=1e-4)
    else:
        assert s.usl.peak_num_devices is None and s.usl.peak_tokens_per_sec is None


# ---------------------------------------------------------------------------------------- output


def test_json_round_trip_and_csv_rows():
    runs = [run(n, 100.0 * n * (1 - 0.01 * i)) for i, n in enumerate((8, 16, 32))]
    runs += [run(n, 115.0 * n, precision="fp8-rowwise") for n in (8, 16)]
    runs += [run(32, None, "fp8-rowwise", status="failed")]
    r = build_report(runs)
    assert ScalingReport.model_validate_json(r.model_dump_json()) == r
    rows = to_csv_rows(r)
    assert len(rows) == 6 and all(tuple(row) == CSV_COLUMNS for row in rows)
    failed = [row for row in rows if row["status"] == "failed"]
    assert failed == [
        {**failed[0], "precision": "fp8-rowwise", "num_devices": 32, "flags": "failed", "tokens_per_sec": None}
    ]
    text = to_csv(r)
    assert text.splitlines()[0] == ",".join(CSV_COLUMNS) and len(text.splitlines()) == 7


def test_two_thousand_runs_is_fast():
    rng = random.Random(0)
    runs = [
        run(n, 100.0 * n * rng.uniform(0.97, 1.03), precision=p, layout=lay)
        for p in ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp")
        for lay in ("fsdp", "hsdp:shard=8", "tp=2+fsdp", "ddp", "tp=4+fsdp")
        for n in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
        for _ in range(10)
    ]
    assert len(runs) == 2000
    t0 = time.perf_counter()
    r = build_report(runs, full_size_by_cluster={"h200": 8192})
    assert time.perf_counter() - t0 < 0.5  # the API's p50 target is 100 ms, DB included
    assert len(r.series) == 20 and all(s.usl.fitted for s in r.series)
