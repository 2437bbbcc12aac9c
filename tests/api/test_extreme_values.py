"""An accepted import never breaks a read: throughput anywhere in the finite float range that the import takes
(1e155 and 1e-160 tokens/s at three GPU counts broke the fits with OverflowError, ZeroDivisionError and an
AssertionError) reads back from every curve endpoint (scaling JSON and CSV, scaling.png, compare, projection,
plan) without a 5xx; a fit that cannot be made is refused with its reason, and the CSV says what the JSON says.
Real Postgres; the imports go through POST /experiments/import.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clusters import networked_cluster_toml

CLUSTERS_TOML = networked_cluster_toml("h100-ib", "NVIDIA H100 80GB HBM3", 4, "h100-hgx")
BASE = {"model": "debug", "cluster": "h100-ib", "scaling": "weak", "seq_len": 256}
COUNTS = (1, 2, 4)
PROPS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def api(make_client, test_settings, tmp_path):
    f = tmp_path / "clusters.toml"
    f.write_text(CLUSTERS_TOML)
    return make_client(replace(test_settings, clusters_file=str(f)))


def _import(api, name: str, values: dict[tuple[str, int], float]) -> int | None:
    points = [{"num_devices": n, "precision": p, "layout": "fsdp", "tokens_per_sec": x} for (p, n), x in values.items()]
    r = api.post(
        "/experiments/import",
        content=json.dumps(BASE | {"name": name, "points": points}),
        headers={"content-type": "application/json"},
    )
    assert r.status_code in (201, 422), r.text[:500]
    return r.json()["id"] if r.status_code == 201 else None


def curve_paths(exp_id: int, other_id: int) -> list[str]:
    return [
        f"/experiments/{exp_id}/scaling",
        f"/experiments/{exp_id}/scaling?format=csv",
        f"/experiments/{exp_id}/scaling?baseline_num_devices=2",
        f"/experiments/{exp_id}/scaling.png",
        f"/compare?experiments={exp_id},{other_id}",
        f"/compare?experiments={other_id},{exp_id}&format=csv",
        f"/experiments/{exp_id}/losses",
        f"/experiments/{exp_id}/breakdown",
    ]


def projection_paths(exp_id: int) -> list[str]:
    return [
        f"/experiments/{exp_id}/projection?cluster=h100-ib&gpu_counts=8,32,1024",
        f"/experiments/{exp_id}/plan?tokens=1e12&max_gpus=1024",
        f"/experiments/{exp_id}/plan?tokens=1&max_gpus=8",
    ]


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def read_all(api, paths: list[str]) -> dict[str, object]:
    """The 200 answers by path (JSON strict, CSV rows); any 5xx fails."""
    out = {}
    for path in paths:
        r = api.get(path)
        assert r.status_code < 500, (path, r.status_code, r.text[:500])
        kind = r.headers["content-type"]
        if r.status_code == 200 and kind.startswith("application/json"):
            out[path] = _strict(r.text)
        elif r.status_code == 200 and kind.startswith("text/csv"):
            assert "inf" not in r.text.lower().replace("info", "") and "nan" not in r.text.lower(), (path, r.text)
            out[path] = list(csv.DictReader(io.StringIO(r.text)))
    return out


@pytest.fixture
def reference(api) -> int:
    return _import(api, "reference", {(p, n): 1000.0 * n for p in ("bf16", "fp8-tensorwise") for n in COUNTS})


@pytest.mark.parametrize("scale", [1e155, 1e-160, 1e300, 1e-200])
def test_the_outside_testers_imports_read_back_on_every_curve_endpoint(api, reference, scale) -> None:
    exp = _import(
        api,
        f"at {scale:g}",
        {
            (p, n): scale * n * (1.0 if p == "bf16" else 1.2) * (1 - 0.02 * n)
            for p in ("bf16", "fp8-tensorwise")
            for n in COUNTS
        },
    )
    assert exp is not None
    reads = read_all(api, curve_paths(exp, reference))
    scaling = reads[f"/experiments/{exp}/scaling"]
    for s in scaling["series"]:
        for fit in (s["amdahl"], s["usl"]):  # scale-free: fitted at any scale, X1 in the data's own units
            assert fit["fitted"], fit
        assert s["amdahl"]["tokens_per_sec_one_device"] == pytest.approx(
            scale * 1.0 * (1.2 if "fp8" in s["key"]["precision"] else 1.0), rel=0.05
        )
    assert {round(sp["speedup"], 6) for sp in scaling["speedups"]} == {1.2}
    csv_rows = reads[f"/experiments/{exp}/scaling?format=csv"]
    assert {round(float(r["fp8_speedup"]), 6) for r in csv_rows if r["precision"] != "bf16"} == {1.2}


@pytest.mark.parametrize("scale", [1e155, 1e-160, 1e300])
def test_the_outside_testers_imports_project_and_plan_without_a_5xx(api, scale) -> None:
    exp = _import(
        api,
        f"at {scale:g}",
        {
            (p, n): scale * n * (1.0 if p == "bf16" else 1.2) * (1 - 0.02 * n)
            for p in ("bf16", "fp8-tensorwise")
            for n in COUNTS
        },
    )
    assert exp is not None
    reads = read_all(api, projection_paths(exp))
    assert set(reads) == set(projection_paths(exp)), "every path answers 200 with JSON"
    projection = reads[f"/experiments/{exp}/projection?cluster=h100-ib&gpu_counts=8,32,1024"]
    assert set(projection) == {"assumptions", "experiment_id", "gpu_counts", "network", "series", "stacks"}
    assert projection["stacks"] == ["stack of every series: the scalebench runner's (FSDP2 as TorchTitan applies it)"]
    assert projection["experiment_id"] == exp and projection["gpu_counts"] == [8, 32, 1024]
    assert {s["key"]["precision"] for s in projection["series"]} == {"bf16", "fp8-tensorwise"}
    for s in projection["series"]:
        assert [p["num_devices"] for p in s["points"]] == [1, 2, 4, 8, 32, 1024], s["key"]  # measured + asked
        assert [p["status"] for p in s["points"][3:]] == ["projected"] * 3, s["key"]
    plan_keys = {"assumptions", "cheapest_efficient", "experiment_id", "fastest", "fastest_efficient", "gpu_counts"}
    plan_keys |= {"gpu_hour_cost", "max_gpus", "min_efficiency", "network", "notes", "rows", "stacks", "tokens"}
    for path, tokens, counts in (
        (f"/experiments/{exp}/plan?tokens=1e12&max_gpus=1024", 1e12, [2**k for k in range(11)]),
        (f"/experiments/{exp}/plan?tokens=1&max_gpus=8", 1.0, [1, 2, 4, 8]),
    ):
        plan = reads[path]
        assert set(plan) == plan_keys, path
        assert plan["tokens"] == tokens and plan["gpu_counts"] == counts, path
        assert [r["num_devices"] for r in plan["rows"]] == counts, path
        assert plan["rows"][0]["best"]["source"] == "measured", path  # N=1 was imported


def test_a_fit_that_cannot_be_made_is_refused_with_its_reason(api, reference) -> None:
    """Per-device throughput that jumps by 1e12 across N: no scaling law; the answer says so, no 5xx."""
    exp = _import(api, "wild", {("bf16", 1): 1e-150, ("bf16", 2): 1e-138, ("bf16", 4): 1e-150})
    assert exp is not None
    scaling = read_all(api, curve_paths(exp, reference))[f"/experiments/{exp}/scaling"]
    (s,) = scaling["series"]
    for fit in (s["amdahl"], s["usl"]):
        assert not fit["fitted"] and "spans more than" in fit["reason"], fit


finite_positive = st.one_of(
    st.sampled_from([sys.float_info.max, 1e308, 1e155, 1e-160, 1e-300, sys.float_info.min, 5e-324]),
    st.floats(min_value=5e-324, max_value=sys.float_info.max),
)


@PROPS
@given(values=st.lists(finite_positive, min_size=len(COUNTS) * 2, max_size=len(COUNTS) * 2))
def test_any_accepted_import_reads_back_on_every_curve_endpoint(api, reference, values) -> None:
    """Whatever finite throughput the import accepts at three GPU counts and two precisions, no read is a 5xx,
    JSON is strict, CSV has no inf and leaves a cell empty exactly where JSON says null."""
    keys = [(p, n) for p in ("bf16", "fp8-tensorwise") for n in COUNTS]
    exp = _import(api, "any", dict(zip(keys, values)))
    if exp is None:
        return
    reads = read_all(api, curve_paths(exp, reference))
    scaling, rows = reads[f"/experiments/{exp}/scaling"], reads[f"/experiments/{exp}/scaling?format=csv"]
    points = [p for s in scaling["series"] for p in s["points"]]
    for row, p in zip(rows, points, strict=True):
        for column in ("tokens_per_sec", "efficiency", "fp8_speedup", "spread"):
            assert (row[column] == "") == (p[column] is None), (column, row[column], p[column])
    for s in scaling["series"]:
        for fit in (s["amdahl"], s["usl"]):
            assert fit["fitted"] or fit["reason"], fit
