"""bench/calibration_check.py on CPU: the recorded check is what the script computes now, and its report is the
rendering of its figures (bench/results/2026-12-07-calibration-check.*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import calibration_check as cc
from bench.projection_validation import load_published, project

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "bench" / "results" / "2026-12-07-calibration-check"


def test_the_recorded_check_is_what_the_script_computes_and_renders() -> None:
    recorded = json.loads(RESULT.with_suffix(".json").read_text())
    assert RESULT.with_suffix(".md").read_text() == cc.markdown(recorded)
    folds = cc.fold_constants(json.loads((REPO / recorded["validation"]).read_text()))
    series = [s for s in load_published() if len(s.points) >= 3]
    rows = [row for s in series for row in cc.cuts(s, folds[s.source])]
    assert len(series) == recorded["num_series"] and len(rows) == len(recorded["rows"])
    for got, want in zip(rows, recorded["rows"], strict=True):
        assert (got["series"], got["measured_up_to"], got["num_devices"]) == (
            want["series"],
            want["measured_up_to"],
            want["num_devices"],
        )
        assert (
            got["miss_pp"] == pytest.approx(want["miss_pp"], abs=1e-9) and got["across_nodes"] == want["across_nodes"]
        )
    # the default calibrates where a measured point beyond N0 spans nodes: every cut scored is such a case
    assert recorded["num_cuts_across_nodes"] == recorded["num_cuts"] and all(r["across_nodes"] for r in rows)
    summary = cc.summary(rows)
    assert summary.keys() == recorded["summary"].keys()
    for reading, figures in summary.items():
        assert figures == pytest.approx(recorded["summary"][reading], abs=1e-12)
    sources = cc.per_source(rows)
    assert sources.keys() == recorded["per_source"].keys()
    for source, figures in sources.items():
        assert figures == pytest.approx(recorded["per_source"][source], abs=1e-12)
    # what the default rests on: fitted to the measured points, the later ones are missed by less, pooled and in
    # most sources, not only in the publisher with the most points
    assert sum(v["calibrated"] < v["from N0 alone"] for v in sources.values()) > len(sources) / 2
    assert summary["calibrated"]["mean_abs_miss_pp"] < summary["from N0 alone"]["mean_abs_miss_pp"]
    assert summary["calibrated"]["closer_than_from_n0"] > 0.5


def test_a_cut_starts_every_reading_from_the_source_left_out() -> None:
    s = next(s for s in load_published() if s.id == "mosaicml-h100-mpt7b-fsdp-128-512")
    validation = REPO / "bench" / "results" / "2026-12-06-projection-validation-dgxc.json"
    constants = cc.fold_constants(json.loads(validation.read_text()))[s.source]
    assert constants["intra_node_efficiency"] == 1.0  # fitted without MosaicML: not the shipped 0.6
    (row,) = cc.cuts(s, constants)  # 128 and 256 measured; 512 to hit
    assert (row["measured_up_to"], row["num_devices"]) == (256, 512)
    assert set(row["fitted"]) == {"device_speed_cv"}  # one point beyond N0: the speed spread alone
    pub, alone = s.published_efficiency(), project(s, constants)
    assert row["miss_pp"]["from N0 alone"] == pytest.approx(100 * (alone[512] - pub[512]), abs=1e-9)
    continued = pub[256] * alone[512] / alone[256]
    assert row["miss_pp"]["continued"] == pytest.approx(100 * (continued - pub[512]), abs=1e-9)
    assert abs(row["miss_pp"]["calibrated"]) < abs(row["miss_pp"]["from N0 alone"])
