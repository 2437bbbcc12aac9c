"""bench/nightly_thresholds.py on the recorded H200 curves: the steps-ratio spread it reads, and a small replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import nightly_thresholds as nt

REPO = Path(__file__).resolve().parents[2]
CURVES = REPO / "bench/results/2026-12-04-time-to-loss-h200.json"


def test_the_seed_spread_of_the_recorded_runs():
    spread = {(s["engine"], s["precision"]): s for s in nt.steps_ratio_spread([CURVES])}
    assert set(spread) == {
        ("scalebench", "fp8-rowwise"),
        ("scalebench", "fp8-rowwise-gw-hp"),
        ("scalebench", "fp8-tensorwise"),
        ("torchtitan", "fp8-rowwise"),
    }
    assert all(s["kind"] == "between seeds" for s in spread.values())  # one run per seed: no repeats
    assert spread["scalebench", "fp8-rowwise"]["relative_sd"] == pytest.approx(0.068, abs=0.001)
    assert spread["scalebench", "fp8-tensorwise"]["relative_sd"] == pytest.approx(0.006, abs=0.001)


def test_a_replay_separates_noise_a_threshold_absorbs_from_noise_it_does_not(tmp_path):
    assert nt.main(["--series", "40", "--out", str(tmp_path / "r")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    by = {(r["metric"], round(r["ratio_sd"], 3), r["threshold"]): r for r in rows}
    assert by["fp8_speedup", 0.0, 0.05]["false_alarms"] > by["fp8_speedup", 0.0, 0.08]["false_alarms"]
    assert by["effective_speedup", 0.0, 0.12]["detected"]["20%"] >= 0.9
    widest = max(k[1] for k in by if k[0] == "effective_speedup")
    assert by["effective_speedup", widest, 0.12]["false_alarms"] > by["effective_speedup", 0.0, 0.12]["false_alarms"]
    assert "## Replayed" in (tmp_path / "r.md").read_text()
