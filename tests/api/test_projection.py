"""GET /experiments/{id}/projection and /plan on the real Postgres, fed through POST /experiments/import.

The published table is torchtitan's FSDP weak-scaling table (tests/api/test_import.py quotes it): Llama 3.1 8B,
H100 on Grand Teton hosts (8 GPUs per node, 400 Gbit/s per GPU across nodes), seq 8192, local batch 2. The
cluster below describes that network (H100 HGX platform + 400G InfiniBand); the projection starts from the
8-GPU point alone and is pinned to the published E(128) = 97.28 / 97.71 / 98.22%: the table is in the fitting
set of the shipped constants, so this pins the in-sample answer through the API (out-of-sample misses are
measured by bench/projection_validation.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import sqlalchemy as sa

from core.projection.constants import (
    COLLECTIVE_UNITS,
    DEVICE_SPEED_CV,
    INTER_NODE_EFFICIENCY,
    INTRA_NODE_EFFICIENCY,
    STRAGGLER_TAIL,
)
from db.models import Run
from tests.bench.test_projection_validation import pv
from tests.clusters import networked_cluster_toml

TORCHTITAN = {
    ("eager", 8): 5762,
    ("eager", 128): 5605,
    ("compile", 8): 6667,
    ("compile", 128): 6514,
    ("float8", 8): 8532,
    ("float8", 128): 8380,
}
PUBLISHED_E128 = {"eager": 97.28, "compile": 97.71, "float8": 98.22}
CLUSTERS_TOML = """
[[cluster]]
name = "grand-teton-h100"
vendor = "nvidia"
device_name = "NVIDIA H100 (96GB HBM2e, 500W)"
gpus_per_node = 8
max_nodes = 16

[cluster.network]
platform = "h100-hgx"
nic = "ib-400g"

[[cluster]]
name = "mi325x-pollara"
vendor = "amd"
device_name = "AMD Instinct MI325X"
gpus_per_node = 8
max_nodes = 128

[cluster.network]
platform = "mi325x-platform"
nic = "pollara-400g"

[[cluster]]
name = "h100-no-network"
vendor = "nvidia"
device_name = "NVIDIA H100 80GB HBM3"
gpus_per_node = 8
max_nodes = 2

[[cluster]]
name = "h100-one-gpu"
vendor = "nvidia"
device_name = "NVIDIA H100 80GB HBM3"
gpus_per_node = 1
max_nodes = 1
""" + networked_cluster_toml(
    "mi325x-roce", "AMD Instinct MI325X", 128, "mi325x-platform", nic="roce-400g", vendor="amd"
)


@pytest.fixture
def api(make_client, test_settings, tmp_path):
    f = tmp_path / "clusters.toml"
    f.write_text(CLUSTERS_TOML)
    return make_client(replace(test_settings, clusters_file=str(f)))


def _import(api, name: str, techniques: list[tuple[str, str]], compile: bool, counts=(8, 128)) -> int:
    points = [
        {
            "num_devices": n,
            "precision": precision,
            "layout": "fsdp",
            "tokens_per_sec_per_device": TORCHTITAN[(technique, n)],
        }
        for technique, precision in techniques
        for n in counts
    ]
    body = {
        "name": name,
        "model": "8b",
        "cluster": "grand-teton-h100",
        "scaling": "weak",
        "seq_len": 8192,
        "local_batch_size": 2,
        "compile": compile,
        "activation_checkpointing": "full",
        "fp8_all_gather": True,
        "points": points,
    }
    r = api.post("/experiments/import", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ok(r):
    assert r.status_code == 200, r.text
    return r.json()


def _points(body: dict, precision: str) -> dict[int, dict]:
    (s,) = [s for s in body["series"] if s["key"]["precision"] == precision]
    return {p["num_devices"]: p for p in s["points"]}


def test_in_sample_pin_torchtitan_fsdp_table_projected_from_8_gpus_to_128(api) -> None:
    """The published table through import and GET /projection: an in-sample pin (the table is one of the
    series the constants are fitted on), so its 2 pp bound guards drift and says nothing about accuracy on
    unseen clusters."""
    eager = _import(api, "torchtitan FSDP eager", [("eager", "bf16")], False)
    compiled = _import(api, "torchtitan FSDP compile", [("compile", "bf16"), ("float8", "fp8-tensorwise")], True)
    got, both = {}, [("compile", "bf16"), ("float8", "fp8-tensorwise")]
    for exp_id, series in ((eager, [("eager", "bf16")]), (compiled, both)):
        # from the 8-GPU point alone (calibrate=false): the measured 128 would otherwise calibrate it onto itself
        url = f"/experiments/{exp_id}/projection?cluster=grand-teton-h100&gpu_counts=8,128,1024&calibrate=false"
        body = _ok(api.get(url))
        assert body["network"]["source"] == "cluster 'grand-teton-h100' [cluster.network]"
        assert body["network"]["network"]["intra_node_gb_per_s"] == 450.0 and body["assumptions"]
        for technique, precision in series:
            p = _points(body, precision)
            assert sorted(p) == [8, 128, 1024] and {q["status"] for q in p.values()} == {"projected"}
            assert p[8]["error"] == pytest.approx(0.0, abs=1e-9)  # the model starts from the 8-GPU point
            assert p[128]["measured_efficiency"] == pytest.approx(PUBLISHED_E128[technique] / 100, abs=1e-4)
            assert p[1024]["measured_tokens_per_sec"] is None and p[1024]["error"] is None
            # 16 nodes: the ring runs at the slower of NVLink (450 GB/s) and the node's eight 400 Gb/s NICs
            bound = "intra-node" if 450 * INTRA_NODE_EFFICIENCY < 8 * 50 * INTER_NODE_EFFICIENCY else "inter-node"
            assert p[128]["dp_bound"] == bound and p[1024]["efficiency"] < p[128]["efficiency"]
            # every projected point carries its 80% interval; it contains the projection and widens with N
            for q in p.values():
                assert q["efficiency_low"] <= q["efficiency"] <= q["efficiency_high"]
                assert q["tokens_per_sec_low"] <= q["tokens_per_sec"] <= q["tokens_per_sec_high"]
            widths = [p[n]["efficiency_high"] - p[n]["efficiency_low"] for n in (8, 128, 1024)]
            assert widths[0] == 0 < widths[1] < widths[2] and not p[1024]["beyond_validated"]
            assert p[128]["efficiency_low"] <= PUBLISHED_E128[technique] / 100 <= p[128]["efficiency_high"]
            got[technique] = 100 * p[128]["efficiency"]
    for technique, published in PUBLISHED_E128.items():  # in sample: the table is in the fitting set
        assert abs(got[technique] - published) < 2.0, (technique, got[technique], published)
    fp8 = _points(_ok(api.get(f"/experiments/{compiled}/projection?cluster=grand-teton-h100")), "fp8-tensorwise")
    assert fp8[128]["fp8_speedup"] > 1.2 and fp8[1024]["beyond_cluster"] is True  # 16 nodes configured


def test_measured_points_beyond_n0_calibrate_the_projection_by_default(api) -> None:
    """bench/calibration_check.py: fitted to the measured points beyond N0 (each cut it scores has one across
    nodes), the projection misses the published later points by less (1.37 against 1.87 pp on average), so that is
    the default where a measured point beyond N0 spans nodes; calibrate=false projects from N0."""
    exp = _import(api, "calibrated", [("compile", "bf16")], True)
    base = f"/experiments/{exp}/projection?cluster=grand-teton-h100&gpu_counts=128,1024"
    (default,) = _ok(api.get(base))["series"]
    (alone,) = _ok(api.get(f"{base}&calibrate=false"))["series"]
    assert default["calibration"]["fitted"] and default["calibration"]["num_points"] == 1
    assert alone["calibration"] is None
    at = {p["num_devices"]: p for p in default["points"]}
    # through the measured 128 (one point fits the speed spread alone), not where N0 alone would put it
    assert abs(at[128]["error"]) < abs({p["num_devices"]: p for p in alone["points"]}[128]["error"])
    plan = _ok(api.get(f"/experiments/{exp}/plan?cluster=grand-teton-h100&tokens=1T&max_gpus=1024&layouts="))
    plan_alone = _ok(
        api.get(f"/experiments/{exp}/plan?cluster=grand-teton-h100&tokens=1T&max_gpus=1024&layouts=&calibrate=false")
    )
    row = {r["num_devices"]: r["best"]["efficiency"] for r in plan["rows"]}
    row_alone = {r["num_devices"]: r["best"]["efficiency"] for r in plan_alone["rows"]}
    assert row[1024] == pytest.approx(at[1024]["efficiency"], rel=1e-12) and row[1024] != row_alone[1024]
    fitted = "projected after fitting to the measured points beyond N0: bf16 fsdp (calibrate=false"
    assert any(n.startswith(fitted) for n in plan["notes"]) and not any("fitting" in n for n in plan_alone["notes"])
    # measured within one node only (2 to 8 GPUs): no published series checks that fit, so the default leaves it
    # from N0; calibrate=true still fits it
    body = {"name": "one node", "model": "8b", "cluster": "grand-teton-h100", "scaling": "weak", "seq_len": 8192}
    points = [
        {"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec_per_device": x}
        for n, x in ((2, 5000.0), (4, 4800.0), (8, 4600.0))
    ]
    r = api.post("/experiments/import", json=body | {"local_batch_size": 2, "points": points})
    assert r.status_code == 201, r.text
    one_node = f"/experiments/{r.json()['id']}/projection?cluster=grand-teton-h100&gpu_counts=1024"
    assert _ok(api.get(one_node))["series"][0]["calibration"] is None
    assert _ok(api.get(f"{one_node}&calibrate=true"))["series"][0]["calibration"]["fitted"]


def test_projection_csv_and_etag(api) -> None:
    exp = _import(api, "csv", [("compile", "bf16")], True)
    r = api.get(f"/experiments/{exp}/projection?cluster=grand-teton-h100&gpu_counts=64&format=csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    header, *rows = r.text.strip().split("\n")
    assert header.startswith(
        "engine,model,num_layers,precision,layout,scaling,cluster,num_devices,status,tokens_per_sec"
    )
    assert [row.split(",")[7] for row in rows] == ["8", "64", "128"] and all(",projected," in row for row in rows)
    again = api.get(
        f"/experiments/{exp}/projection?cluster=grand-teton-h100&gpu_counts=64&format=csv",
        headers={"If-None-Match": r.headers["ETag"]},
    )
    assert again.status_code == 304


def test_plan_for_a_token_budget(api) -> None:
    exp = _import(api, "plan", [("compile", "bf16"), ("float8", "fp8-tensorwise")], True)
    url = f"/experiments/{exp}/plan?tokens=1T&max_gpus=1024&cluster=grand-teton-h100&gpu_hour_cost=2.5&layouts="
    plan = _ok(api.get(url))  # layouts= (empty): the measured layouts only
    assert plan["tokens"] == 1e12 and plan["gpu_counts"] == [8, 16, 32, 64, 128, 256, 512, 1024]
    rows = {r["num_devices"]: r for r in plan["rows"]}
    assert {o["source"] for o in rows[128]["options"]} == {"measured"}
    assert {o["source"] for o in rows[512]["options"]} == {"projected"}
    o512 = rows[512]["best"]
    assert o512["time_to_train_hours_low"] < o512["time_to_train_hours"] < o512["time_to_train_hours_high"]
    assert o512["gpu_hours_low"] < o512["gpu_hours"] < o512["gpu_hours_high"]
    best128 = rows[128]["best"]
    assert best128["precision"] == "fp8-tensorwise" and best128["tokens_per_sec"] == pytest.approx(8380 * 128)
    assert best128["time_to_train_hours"] == pytest.approx(1e12 / (8380 * 128) / 3600)
    assert best128["cost"] == pytest.approx(2.5 * best128["gpu_hours"])
    assert plan["fastest"]["num_devices"] == 1024 and plan["fastest"]["precision"] == "fp8-tensorwise"
    cheap = plan["cheapest_efficient"]
    assert cheap["efficiency"] >= 0.9 and cheap["num_devices"] == 8 and cheap["source"] == "measured"
    assert plan["fastest_efficient"]["efficiency"] >= 0.9 and plan["network"]["cluster"] == "grand-teton-h100"
    small = _ok(api.get(f"/experiments/{exp}/plan?tokens=1e9&max_gpus=64&min_efficiency=0.5&layouts="))
    assert small["gpu_counts"] == [8, 16, 32, 64] and small["fastest"]["num_devices"] == 64


def test_the_best_layout_per_n_weighs_pipeline_and_context_parallel_by_default(api) -> None:
    exp = _import(api, "plan-pp-cp", [("compile", "bf16")], True)
    plan = _ok(api.get(f"/experiments/{exp}/plan?tokens=1T&max_gpus=1024&cluster=grand-teton-h100"))
    forms = {"fsdp", "pp=2+fsdp", "pp=4+fsdp", "pp=8+fsdp", "cp=2+fsdp"}
    rows = {r["num_devices"]: r for r in plan["rows"]}
    for n in (64, 1024):
        assert {o["layout"] for o in rows[n]["options"]} == forms, n
        assert rows[n]["best"]["tokens_per_sec"] == max(o["tokens_per_sec"] for o in rows[n]["options"])
    # the measured point stays measured; every pp / cp option is projected, with its interval
    at128 = {o["layout"]: o for o in rows[128]["options"]}
    assert at128["fsdp"]["source"] == "measured" and at128["fsdp"]["tokens_per_sec"] == pytest.approx(6514 * 128)
    for layout in forms - {"fsdp"}:
        o = at128[layout]
        assert o["source"] == "projected" and o["efficiency_low"] < o["efficiency"] < o["efficiency_high"], layout
    # a pipeline of 8 stages needs 8 GPUs at least: pp=8+fsdp starts at 8, not below
    assert "pp=8+fsdp" in {o["layout"] for o in rows[8]["options"]}
    # asked layouts replace the default forms; an empty list plans with the measured layouts only
    asked = _ok(api.get(f"/experiments/{exp}/plan?tokens=1T&max_gpus=1024&layouts=pp%3D2%2Bfsdp"))
    assert {o["layout"] for r in asked["rows"] for o in r["options"]} == {"fsdp", "pp=2+fsdp"}
    measured = _ok(api.get(f"/experiments/{exp}/plan?tokens=1T&max_gpus=1024&layouts="))
    assert {o["layout"] for r in measured["rows"] for o in r["options"]} == {"fsdp"}


def test_bad_parameters_are_422_naming_the_parameter(api) -> None:
    exp = _import(api, "bad", [("eager", "bf16")], False, counts=(8,))

    def problem(url: str) -> dict:
        r = api.get(url)
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        return {e["field"]: e for e in r.json()["errors"]}

    assert (
        "e.g. 8,64,512,1024"
        in problem(f"/experiments/{exp}/projection?gpu_counts=8,x")["query.gpu_counts"]["allowed"][0]
    )
    assert "query.gpu_counts" in problem(f"/experiments/{exp}/projection?gpu_counts=0")
    unknown = problem(f"/experiments/{exp}/projection?cluster=nowhere")["query.cluster"]
    assert "grand-teton-h100" in unknown["allowed"] and "local-cpu" not in unknown["allowed"]
    assert "1T" in problem(f"/experiments/{exp}/plan?tokens=lots&max_gpus=8")["query.tokens"]["allowed"][0]
    assert "query.max_gpus" in problem(f"/experiments/{exp}/plan?tokens=1T")
    assert "query.min_efficiency" in problem(f"/experiments/{exp}/plan?tokens=1T&max_gpus=8&min_efficiency=2")
    assert "query.format" in problem(f"/experiments/{exp}/projection?format=xml")
    stack = problem(f"/experiments/{exp}/projection?stack=dp_overlap=sometimes")["query.stack"]
    assert stack["message"] == "dp_overlap: 'sometimes' is not one of overlapped, reduce-after, none"
    assert "grad_reduce_bytes (2|4)" in stack["allowed"][0]
    assert "query.stack" in problem(f"/experiments/{exp}/plan?tokens=1T&max_gpus=8&stack=zero_stage=3")
    assert api.get("/experiments/999999/projection").status_code == 404


def test_network_inferred_or_refused(api) -> None:
    exp = _import(api, "infer", [("compile", "bf16")], True)
    body = _ok(api.get(f"/experiments/{exp}/projection?cluster=h100-no-network&gpu_counts=16"))
    assert body["network"]["source"].startswith("assumed: h100-hgx + ib-400g")
    assert body["network"]["gpus_per_node"] == 8 and "the cluster being one GPU" not in body["network"]["source"]
    # a one-GPU machine: a larger cluster of it is assumed to have the platform's nodes of 8, not nodes of one
    one = _ok(api.get(f"/experiments/{exp}/projection?cluster=h100-one-gpu&gpu_counts=8,16"))
    assert one["network"]["gpus_per_node"] == 8 and one["network"]["max_devices"] == 1
    assert one["network"]["source"].endswith("; 8 GPUs a node as on that platform, the cluster being one GPU")
    bound = {p["num_devices"]: p["dp_bound"] for s in one["series"] for p in s["points"]}
    assert (bound[8], bound[16]) == ("intra-node", "inter-node")
    cpu = api.post(
        "/experiments/import",
        json={
            "name": "cpu",
            "model": "debug",
            "cluster": "local-cpu",
            "seq_len": 256,
            "points": [
                {"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0 * n} for n in (1, 2)
            ],
        },
    ).json()["id"]
    refused = api.get(f"/experiments/{cpu}/projection")
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "query.cluster"
    onto = _points(_ok(api.get(f"/experiments/{cpu}/projection?cluster=grand-teton-h100&gpu_counts=1,2,16")), "bf16")
    assert onto[1]["communication_ms"] == 0 and onto[16]["communication_ms"] > 0


def test_step_breakdown_sets_the_compute_share(api, pg_session_factory) -> None:
    exp = _import(api, "breakdown", [("compile", "bf16")], True)
    step_ms = 2 * 8192 / 6667 * 1e3
    profiled = 1.1 * step_ms  # profiled steps run slower; the breakdown's shares apply to the measured step
    breakdown = {
        "step_ms": profiled,
        "exposed_communication_ms": 0.1 * profiled,
        "idle_ms": 0.05 * profiled,
        "optimizer_ms": 22.0,
    }
    with pg_session_factory() as s:
        for run in s.scalars(sa.select(Run).where(Run.experiment_id == exp, Run.num_devices == 8)):
            run.result = {**run.result, "breakdown": {"median": breakdown}}
        s.commit()
    body = _ok(api.get(f"/experiments/{exp}/projection?cluster=grand-teton-h100&gpu_counts=8,128"))
    (series,) = body["series"]
    p = {q["num_devices"]: q for q in series["points"]}
    assert series["compute_source"] == "breakdown"
    # 85% of the step is compute (less optimizer and the model's own slow-down of overlapped compute)
    assert p[8]["compute_ms"] + p[8]["interference_ms"] == pytest.approx(0.85 * step_ms - 20.0, rel=1e-6)
    assert p[8]["idle_ms"] == p[128]["idle_ms"] == pytest.approx(0.05 * step_ms)
    assert p[128]["optimizer_ms"] == pytest.approx(20.0 * 8 / 128)  # the sharded optimizer step shrinks
    assert p[8]["error"] != pytest.approx(0.0, abs=1e-6)  # the model's exposure at N0 differs from the measured one


def test_cli_plan_prints_the_plan(api, test_settings, tmp_path) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from tests.live_server import live_server

    exp = _import(api, "cli plan", [("compile", "bf16"), ("float8", "fp8-tensorwise")], True)
    settings = replace(test_settings, clusters_file=str(tmp_path / "clusters.toml"))
    with live_server(settings) as url:
        base = ["plan", str(exp), "--max-gpus", "1024", "--cluster", "grand-teton-h100", "--server", url]
        table = CliRunner().invoke(app, [*base, "--tokens", "1T", "--gpu-hour-cost", "2"])
        as_json = CliRunner().invoke(app, [*base, "--tokens", "500B", "--json"])
        bad = CliRunner().invoke(app, [*base, "--tokens", "lots"])
        missing = CliRunner().invoke(app, ["plan", "999999", "--tokens", "1T", "--max-gpus", "8", "--server", url])
        piped = CliRunner().invoke(app, [*base, "--tokens", "1T", "--layout", "pp=2+fsdp", "--all", "--json"])
        stacked = CliRunner().invoke(app, [*base, "--tokens", "1T", "--stack", "grad_reduce_bytes=2", "--json"])
        bad_stack = CliRunner().invoke(app, [*base, "--tokens", "1T", "--stack", "grad_reduce_bytes=3"])
    assert table.exit_code == 0, table.output
    assert "fastest within the cap: N=1024 fp8-tensorwise fsdp (projected)" in table.output
    assert "cheapest with E(N) >= 90%: N=8 fp8-tensorwise fsdp (measured)" in table.output
    assert "E(N) ±80%" in table.output and "GPU-h 80%" in table.output and "(80%: " in table.output
    assert "note: stack of every series: the scalebench runner's (FSDP2" in table.output
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["tokens"] == 5e11
    assert bad.exit_code == 1 and "allowed" in bad.output
    assert missing.exit_code == 1 and "experiment 999999 does not exist" in missing.output
    assert piped.exit_code == 0, piped.output
    rows = {r["num_devices"]: r for r in json.loads(piped.stdout)["rows"]}
    assert {o["layout"] for o in rows[1024]["options"]} == {"fsdp", "pp=2+fsdp"}
    assert stacked.exit_code == 0, stacked.output
    assert json.loads(stacked.stdout)["stacks"] == [
        "stack of every series: as the request describes it, grad_reduce_bytes=2"
    ]
    assert json.loads(stacked.stdout)["assumptions"][0].startswith(
        "stack of every series: as the request describes it, grad_reduce_bytes=2;"
    )
    assert bad_stack.exit_code == 1 and "--stack: grad_reduce_bytes: '3' is not one of 2, 4" in bad_stack.output


def test_dashboard_loads_the_projection_script(api) -> None:
    assert '<script src="/static/projection.js"></script>' in api.get("/").text
    js = api.get("/static/projection.js")
    assert js.status_code == 200 and "/projection" in js.text and "SBProjection" in js.text
    assert '"_low"' in js.text and '"_high"' in js.text  # the 80% interval drawn as a band


def test_projection_and_plan_accept_pipeline_and_context_parallel_layouts(api) -> None:
    exp = _import(api, "pp cp", [("compile", "bf16")], True)
    url = f"/experiments/{exp}/projection?gpu_counts=64,1024&layouts=pp%3D2%2Bfsdp,cp=2 fsdp"  # a bare + is a space
    body = _ok(api.get(url))
    layouts = [s["key"]["layout"] for s in body["series"]]
    assert layouts == ["fsdp", "pp=2+fsdp", "cp=2+fsdp"]
    pp = {p["num_devices"]: p for p in body["series"][1]["points"]}
    assert pp[1024]["status"] == "projected" and pp[1024]["efficiency_low"] < pp[1024]["efficiency_high"]
    assert "projected onto layout pp=2+fsdp" in body["series"][1]["notes"][0]
    bad = api.get(f"/experiments/{exp}/projection?layouts=pp=2")
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.layouts"
    assert "pp=4+tp=2+fsdp" in bad.json()["errors"][0]["allowed"][0]
    csv = api.get(url + "&format=csv").text
    assert "pp=2+fsdp" in csv and "cp=2+fsdp" in csv


def test_plan_for_1024_gpus_of_an_8b_model_on_mi325x_lists_its_interval(api) -> None:
    exp = _import(api, "mi325x", [("compile", "bf16")], True, counts=(8,))
    url = f"/experiments/{exp}/plan?tokens=1T&max_gpus=1024&cluster=mi325x-pollara&layouts=pp%3D2%2Bfsdp"
    plan = _ok(api.get(url))
    assert plan["network"]["cluster"] == "mi325x-pollara" and plan["network"]["network"]["nic"] == "pollara-400g"
    row = next(r for r in plan["rows"] if r["num_devices"] == 1024)
    assert {o["layout"] for o in row["options"]} == {"fsdp", "pp=2+fsdp"}
    for o in row["options"]:
        assert o["source"] == "projected"
        assert o["efficiency_low"] < o["efficiency"] < o["efficiency_high"]
        assert o["time_to_train_hours_low"] < o["time_to_train_hours"] < o["time_to_train_hours_high"]


def test_a_described_stack_is_projected_as_the_validation_scores_it(api) -> None:
    """AMD's MI325X Megatron row of bench/published imported as the team's own stack: without a description the
    series is charged the runner's collectives and says so; described as its published file describes it, the API
    projects what bench/projection_validation.py scores with the shipped constants."""
    (pub,) = [s for s in pv.load_published() if s.id == "amd-mi325x-8b-fp8-megatron-dp"]
    shipped = {
        "collective_units": COLLECTIVE_UNITS,
        "intra_node_efficiency": INTRA_NODE_EFFICIENCY,
        "inter_node_efficiency": INTER_NODE_EFFICIENCY,
        "device_speed_cv": DEVICE_SPEED_CV,
        "straggler_tail_exponential": 1.0 if STRAGGLER_TAIL == "exponential" else 0.0,
    }
    expected = pv.project(pub, shipped)[64]
    head = {
        "name": "primus mi325x",
        "model": "8b",
        "cluster": "mi325x-roce",
        "scaling": "weak",
        "seq_len": 8192,
        "local_batch_size": 16,
        "points": [
            {
                "num_devices": n,
                "precision": "fp8-tensorwise",
                "layout": "ddp",
                "engine": "command:primus",
                "tokens_per_sec_per_device": x,
            }
            for n, x in pub.points.items()
        ],
    }
    r = api.post("/experiments/import", json=head)
    assert r.status_code == 201, r.text
    # from N0 alone, as the validation projects a published series (the measured 64 would calibrate it onto itself)
    url = f"/experiments/{r.json()['id']}/projection?gpu_counts=64&calibrate=false"
    (runner,) = _ok(api.get(url))["series"]
    assert runner["notes"][0].startswith("measured on command:primus, projected with the scalebench runner's")
    stack = "distributed_optimizer=true,dp_buckets=megatron,micro_batch_size=2"
    assert pub.workload.distributed_optimizer and pub.workload.dp_buckets == "megatron"
    assert pub.workload.micro_batch_size == 2 and pub.workload.grad_reduce_bytes == 4
    body = _ok(api.get(f"{url}&stack={stack}"))
    (described,) = body["series"]
    assert body["assumptions"][0].startswith(
        f"stack of every series: as the request describes it, {stack.replace(',', ', ')} (distributed"
    )
    assert not any("describe its stack" in n for n in described["notes"])
    e64 = {p["num_devices"]: p["efficiency"] for p in described["points"]}[64]
    assert e64 == pytest.approx(expected, abs=1e-9)
    assert {p["num_devices"]: p["efficiency"] for p in runner["points"]}[64] != pytest.approx(expected, abs=1e-4)

    # described once, with the import: every projection of the experiment charges it
    stored = api.post(
        "/experiments/import", json=head | {"stacks": {"command:primus": stack.replace("true", " TRUE ")}}
    )
    assert stored.status_code == 201, stored.text
    assert api.get(f"/experiments/{stored.json()['id']}").json()["spec"]["stacks"] == {"command:primus": stack}
    body = _ok(api.get(f"/experiments/{stored.json()['id']}/projection?gpu_counts=64&calibrate=false"))
    assert body["assumptions"][0].startswith("stack of command:primus series: as the experiment's stacks describe")
    assert body["stacks"] == [
        f"stack of command:primus series: as the experiment's stacks describe it, {stack.replace(',', ', ')} "
        "(distributed_optimizer applies to ddp layouts only)",
        "stack of the other series: the scalebench runner's (FSDP2 as TorchTitan applies it)",
    ]
    assert {p["num_devices"]: p["efficiency"] for p in body["series"][0]["points"]}[64] == pytest.approx(e64, abs=1e-12)
    for stacks, says in (
        ({"scalebench": stack}, "'scalebench' runs the scalebench runner's stack: describe command engines only"),
        ({"command:other": stack}, "'command:other' is not one of the experiment's engines (command:primus)"),
        ({"command:primus": "dp_overlap=late"}, "command:primus: dp_overlap: 'late' is not one of overlapped"),
    ):
        bad = api.post("/experiments/import", json=head | {"stacks": stacks})
        assert bad.status_code == 422, bad.text
        (error,) = bad.json()["errors"]
        assert error["field"].endswith("stacks") and says in error["message"], error


def test_a_stack_with_virtual_stages_hides_its_chunks_collectives_through_the_api(api) -> None:
    # Megatron-Core's interleaved 1F1B with overlapped collectives, described per request: a chunk's data-parallel
    # traffic runs beside other chunks' micro-batches, so less of the same traffic is exposed than with one chunk.
    # A fast device and 32 sequences a rank: one micro-batch's compute is too short to hide a block's collectives.
    body = {
        "name": "interleaved",
        "model": "8b",
        "cluster": "grand-teton-h100",
        "scaling": "weak",
        "seq_len": 8192,
        "local_batch_size": 32,
        "points": [{"num_devices": 8, "precision": "bf16", "layout": "fsdp", "tokens_per_sec_per_device": 60000}],
    }
    r = api.post("/experiments/import", json=body)
    assert r.status_code == 201, r.text
    query = "gpu_counts=1024&layouts=pp%3D4%2Bfsdp&stack=dp_overlap%3Doverlapped"
    url = f"/experiments/{r.json()['id']}/projection?{query}"

    def at1024(stack: str) -> dict:
        (pp,) = [s for s in _ok(api.get(url + stack))["series"] if s["key"]["layout"] == "pp=4+fsdp"]
        return {p["num_devices"]: p for p in pp["points"]}[1024]

    one, interleaved = at1024(""), at1024("%2Cvirtual_stages%3D4")
    assert interleaved["communication_ms"] == pytest.approx(one["communication_ms"])
    assert interleaved["exposed_communication_ms"] < one["exposed_communication_ms"]


def test_a_stack_without_a_networked_cluster_says_where_one_is_described(make_client, test_settings, tmp_path):
    f = tmp_path / "clusters.toml"
    f.write_text(
        '[[cluster]]\nname = "local-cpu"\nvendor = "cpu"\ndevice_name = "cpu (gloo ranks)"\n'
        "gpus_per_node = 4\nmax_nodes = 1\n"
    )
    api = make_client(replace(test_settings, clusters_file=str(f)))
    points = [{"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0 * n} for n in (1, 2)]
    body = {"name": "cpu", "model": "debug", "cluster": "local-cpu", "seq_len": 256, "points": points}
    exp = api.post("/experiments/import", json=body).json()["id"]
    for url in (f"/experiments/{exp}/projection", f"/experiments/{exp}/plan?tokens=1T&max_gpus=64&cluster=h100"):
        r = api.get(url)
        (error,) = r.json()["errors"]
        assert r.status_code == 422 and error["field"] == "query.cluster" and error["allowed"] == []
        assert (
            "no configured cluster has a network" in error["message"] and "SCALEBENCH_CLUSTERS_FILE" in error["message"]
        )


def test_a_plan_with_nothing_measured_says_so(api, pg_session_factory) -> None:
    import db.runs
    from db.session import session_scope

    spec = {"name": "f", "model": "8b", "num_layers": 2, "cluster": "grand-teton-h100", "gpu_counts": [8, 16]}
    r = api.post("/experiments", json=spec | {"precisions": ["bf16"]})
    assert r.status_code == 201, r.text
    with session_scope(pg_session_factory) as s:
        for run in r.json()["runs"]:
            db.runs.mark_failed(s, run["id"], "oom", "out of memory")
    plan = _ok(api.get(f"/experiments/{r.json()['id']}/plan?tokens=1T&max_gpus=1024"))
    assert plan["rows"] == [] and plan["notes"][0].startswith("no option: no point of the experiment was measured")
