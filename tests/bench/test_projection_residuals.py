"""bench/projection_residuals.py on CPU: the recorded analysis is what the script computes now, its report is the
rendering of its figures, and its misses are the validation's (bench/results/2026-12-07-projection-residuals.*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import projection_residuals as pr
from bench.projection_validation import load_published

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "bench" / "results" / "2026-12-07-projection-residuals"


def test_the_recorded_analysis_is_what_the_script_computes_and_renders() -> None:
    recorded = json.loads(RESULT.with_suffix(".json").read_text())
    assert RESULT.with_suffix(".md").read_text() == pr.markdown(recorded)
    validation = json.loads((REPO / recorded["validation"]).read_text())
    shipped = validation["variants"][validation["shipped_variant"]]
    rows = pr.rows_of(load_published(), pr.fold_constants(validation))
    assert [(r["series"], r["num_devices"]) for r in rows] == [
        (r["series"], r["num_devices"]) for r in recorded["rows"]
    ]
    assert [r["miss_pp"] for r in rows] == pytest.approx([r["miss_pp"] for r in recorded["rows"]], abs=1e-9)
    features = pr.feature_table(rows)
    assert [f["feature"] for f in features] == [f["feature"] for f in recorded["features"]]
    for got, want in zip(features, recorded["features"], strict=True):
        assert got["per_source"] == pytest.approx(want["per_source"], abs=1e-12)
        assert (got["spearman"], got["within_sources"]) == pytest.approx((want["spearman"], want["within_sources"]))
    effects = pr.source_effects(rows)
    # the misses are the validation's own: the same mean over series and over points
    assert effects["series_mean_abs_miss_pp"] == pytest.approx(shipped["series_mean_abs_miss_pp"], abs=1e-9)
    assert len(rows) == shipped["num_points"]
    per_source = effects.pop("per_source")
    assert per_source.keys() == recorded["source_effects"]["per_source"].keys()
    for source, figures in per_source.items():
        assert figures == pytest.approx(recorded["source_effects"]["per_source"][source], abs=1e-12)
    for key, value in effects.items():
        assert value == pytest.approx(recorded["source_effects"][key], abs=1e-12)
    corrections = pr.cross_source_corrections(rows)
    assert [c["feature"] for c in corrections] == [c["feature"] for c in recorded["cross_source"]]
    for key in ("series_mean_abs_miss_pp", "least_squares_pp"):
        assert [c[key] for c in corrections] == pytest.approx([c[key] for c in recorded["cross_source"]], abs=1e-9)


def test_a_source_offset_in_sample_is_zero_on_a_source_of_one_point() -> None:
    rows = [
        {"series": "a", "source": "x", "doublings": 1.0, "miss_pp": 2.0},
        {"series": "b", "source": "y", "doublings": 1.0, "miss_pp": 1.0},
        {"series": "c", "source": "y", "doublings": 2.0, "miss_pp": 3.0},
    ]
    effects = pr.source_effects(rows)
    assert effects["series_mean_abs_miss_pp"] == pytest.approx(2.0)
    # in sample, source x's single point is absorbed whole; y keeps |1 - 2| and |3 - 2|
    assert effects["less_source_offset_pp"] == pytest.approx((0 + 1 + 1) / 3)
    # from the other series only: x has none and keeps its 2; b less c's 3 misses by 2, c less b's 1 by 2
    assert effects["less_other_series_offset_pp"] == pytest.approx((2 + 2 + 2) / 3)
    # y's slope through N0: (1 x 1 + 3 x 2) / (1 + 4) = 1.4 a doubling
    assert effects["per_source"]["y"]["miss_per_doubling_pp"] == pytest.approx(1.4)


def test_least_absolute_deviations_follow_the_line_not_the_outlier() -> None:
    xs = [(d, f * d) for d, f in [(1, 0), (2, 0), (3, 0), (4, 0), (1, 1), (2, 1), (3, 1)]]
    ys = [2 * d + 0.5 * fd for d, fd in xs]
    ys[0] += 30  # one point far off the line (least squares would follow it)
    b0, b1 = pr._lad(xs, ys)
    assert (b0, b1) == pytest.approx((2.0, 0.5), abs=0.01)
    # a feature of one value cannot be told from the slope: it gets no coefficient
    assert pr._lad([(1.0, 1.0), (2.0, 2.0)], [1.0, 2.0]) == pytest.approx((1.0, 0.0))


def test_a_feature_learnt_across_sources_is_taken_off_the_held_out_source() -> None:
    rows = [
        {"series": s, "source": src, "doublings": d, "miss_pp": m, "features": {n: 0.0 for n in pr.FEATURES}}
        for s, src, d, m in [("a", "x", 1.0, 1.0), ("b", "y", 4.0, 8.0), ("c", "z", 2.0, 1.0)]
    ]
    (slope_only, *_) = pr.cross_source_corrections(rows)
    assert slope_only["feature"] is None
    # through the origin, the LAD slope of two points is the ratio of the one with more doublings:
    # x less 8/4 = 2 a doubling: |1 - 2| = 1; y less 1/2 a doubling: |8 - 2| = 6; z less 2: |1 - 4| = 3
    # (to within the reweighting's floor, LAD_FLOOR_PP)
    assert slope_only["series_mean_abs_miss_pp"] == pytest.approx((1 + 6 + 3) / 3, abs=pr.LAD_FLOOR_PP)
    # least squares through the origin: slopes 34/20, 3/5 and 33/17 leave |1 - 1.7|, |8 - 2.4| and |1 - 66/17|
    assert slope_only["least_squares_pp"] == pytest.approx((0.7 + 5.6 + (66 / 17 - 1)) / 3)
