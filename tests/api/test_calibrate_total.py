"""Calibration is total: `/projection?calibrate=true` and `/plan?...&calibrate=true` answer without a 5xx for
every import the store accepts (an import of bf16/fsdp N=1 at 1 tok/s and N=2 at 1e-160 tok/s was a 500
OverflowError in the calibration's root-mean-square). Real Postgres; imports go through POST /experiments/import.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.api.test_extreme_values import CLUSTERS_TOML, PROPS, _import, read_all


@pytest.fixture
def api(make_client, test_settings, tmp_path):
    f = tmp_path / "clusters.toml"
    f.write_text(CLUSTERS_TOML)
    return make_client(replace(test_settings, clusters_file=str(f)))


CALIBRATED_PATHS = (
    "/experiments/{id}/projection?cluster=h100-ib&gpu_counts=8,32,1024&calibrate=true",
    "/experiments/{id}/projection?calibrate=true",
    "/experiments/{id}/plan?tokens=1e12&max_gpus=1024&calibrate=true",
    "/experiments/{id}/plan?tokens=1&max_gpus=8&calibrate=true",
)


def _calibrated(exp_id: int) -> list[str]:
    return [p.format(id=exp_id) for p in CALIBRATED_PATHS]


def test_the_reported_import_calibrates_without_a_5xx(api) -> None:
    exp = _import(api, "overflow", {("bf16", 1): 1.0, ("bf16", 2): 1e-160})
    assert exp is not None
    reads = read_all(api, _calibrated(exp))
    projection = reads[_calibrated(exp)[0]]
    (series,) = projection["series"]
    calibration = series["calibration"]
    assert calibration["fitted"] or calibration["reason"], calibration


throughput = st.one_of(
    st.sampled_from([sys.float_info.max, 1e308, 1e155, 1.0, 1e-160, 1e-300, sys.float_info.min, 5e-324]),
    st.floats(min_value=5e-324, max_value=sys.float_info.max),
)


@PROPS
@given(
    counts=st.lists(st.sampled_from([1, 2, 4, 8, 16, 32]), min_size=1, max_size=4, unique=True),
    values=st.lists(throughput, min_size=4, max_size=4),
)
def test_any_accepted_import_calibrates_without_a_5xx(api, counts, values) -> None:
    exp = _import(api, "any", {("bf16", n): x for n, x in zip(sorted(counts), values)})
    if exp is None:
        return
    read_all(api, _calibrated(exp))
