"""POST /experiments/import on the real Postgres: a published weak-scaling table reproduced, and validation.

The published table: torchtitan's docs/performance.md (pytorch/torchtitan, the version listing torch
1963fc8 / torchao eab345c / torchtitan 9dec370 of 2024-12, "Versions used for performance testing"),
Table 1 (8 GPUs) and Table 3 (128 GPUs): Llama 3.1 8B, 1D FSDP, local batch size 2, selective activation
checkpointing, H100 (96 GB HBM2e, 500 W) on Grand Teton hosts. TPS/GPU (memory GiB):

    technique                      8 GPUs          128 GPUs
    FSDP                           5,762 (82.4)    5,605 (67.0)
    FSDP + torch.compile           6,667 (77.0)    6,514 (62.0)
    FSDP + torch.compile + Float8  8,532 (76.8)    8,380 (61.8)

Weak scaling (fixed local batch), so E(128) = TPS/GPU(128) / TPS/GPU(8): 97.28%, 97.71%, 98.22%.
Float8 at the time was torchao's dynamic tensorwise recipe (fp8-tensorwise here). The seq_len is
torchtitan's Llama 3 8B default (8192). Eager and compiled bf16 go in two experiments (compile is an
experiment-level setting), which also exercises /compare.
"""

from __future__ import annotations

import csv
import io
import math
import random

import pytest

from core.catalog.shapes import get_shape

TORCHTITAN_TPS_PER_GPU = {  # (technique, N) -> (TPS/GPU, memory GiB)
    ("eager", 8): (5762, 82.4),
    ("eager", 128): (5605, 67.0),
    ("compile", 8): (6667, 77.0),
    ("compile", 128): (6514, 62.0),
    ("float8", 8): (8532, 76.8),
    ("float8", 128): (8380, 61.8),
}
DEVICE = "NVIDIA H100 (96GB HBM2e, 500W)"


def _point(technique: str, n: int, precision: str) -> dict:
    tps, mem = TORCHTITAN_TPS_PER_GPU[(technique, n)]
    return {
        "num_devices": n,
        "precision": precision,
        "layout": "fsdp",
        "tokens_per_sec_per_device": tps,
        "peak_memory_gib": mem,
        "environment": {"torch_version": "2.6.0a0+git1963fc8", "torchao_version": "0.8.0+giteab345c"},
    }


def _import(client, name: str, points: list[dict], compile: bool) -> dict:
    body = {
        "name": name,
        "model": "8b",
        "cluster": "grand-teton-h100",
        "vendor": "nvidia",
        "device_name": DEVICE,
        "scaling": "weak",
        "seq_len": 8192,
        "local_batch_size": 2,
        "compile": compile,
        "activation_checkpointing": "full",
        "tags": ["torchtitan-docs"],
        "points": points,
    }
    r = client.post("/experiments/import", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_torchtitan_published_table_reproduces_efficiency_and_speedup(client) -> None:
    eager = _import(client, "torchtitan FSDP eager", [_point("eager", n, "bf16") for n in (8, 128)], False)
    compiled = _import(
        client,
        "torchtitan FSDP compile (+Float8)",
        [_point(t, n, p) for t, p in (("compile", "bf16"), ("float8", "fp8-tensorwise")) for n in (8, 128)],
        True,
    )
    assert eager["source"] == compiled["source"] == "import" and compiled["status"] == "succeeded"
    assert r_ok(client.get(f"/runs/{eager['runs'][0]['id']}"))["imported"] is True

    rep = client.get(f"/experiments/{compiled['id']}/scaling").json()
    eff = {(s["key"]["precision"], p["num_devices"]): p["efficiency"] for s in rep["series"] for p in s["points"]}
    assert abs(100 * eff[("bf16", 128)] - 97.71) < 0.1
    assert abs(100 * eff[("fp8-tensorwise", 128)] - 98.22) < 0.1
    assert eff[("bf16", 8)] == pytest.approx(1.0)
    eager_rep = client.get(f"/experiments/{eager['id']}/scaling").json()
    assert abs(100 * eager_rep["series"][0]["points"][1]["efficiency"] - 97.28) < 0.1
    speedups = {sp["num_devices"]: sp["speedup"] for sp in rep["speedups"]}
    assert speedups == pytest.approx({8: 8532 / 6667, 128: 8380 / 6514}, abs=1e-4)

    # MFU: the H100 is in the peak table (989 dense bf16 TFLOP/s, 1979 fp8), FLOPs/token by the PaLM formula
    fp8_128 = next(
        p
        for s in rep["series"]
        if s["key"]["precision"] == "fp8-tensorwise"
        for p in s["points"]
        if p["num_devices"] == 128
    )
    tflops = get_shape("8b").flops_per_token(8192) * 8380 / 1e12
    assert fp8_128["mfu_vs_bf16_peak"] == pytest.approx(tflops / 989.0)
    assert fp8_128["mfu_vs_precision_peak"] == pytest.approx(tflops / 1979.0)
    assert fp8_128["peak_memory_allocated_gib"] == pytest.approx(61.8)
    assert "imported" in fp8_128["flags"]

    cmp = client.get(f"/compare?experiments={eager['id']},{compiled['id']}").json()
    ratio = {r["num_devices"]: r["ratio"] for r in cmp["ratios"]}
    assert ratio == pytest.approx({8: 6667 / 5762, 128: 6514 / 5605}, abs=1e-4)


def r_ok(r):
    assert r.status_code == 200, r.text
    return r.json()


BASE = {"name": "imp", "model": "debug", "cluster": "local-cpu", "scaling": "weak", "seq_len": 256}


def _problem(client, body: dict) -> dict:
    r = client.post("/experiments/import", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return r.json()


def _fields(problem: dict) -> dict[str, dict]:
    return {e["field"]: e for e in problem["errors"]}


def test_validation_names_the_fields(client) -> None:
    ok = {"num_devices": 2, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    bad_precision = _fields(_problem(client, BASE | {"points": [ok | {"precision": "fp4"}]}))
    assert "bf16" in bad_precision["points[0].precision"]["allowed"]
    layout = _fields(_problem(client, BASE | {"points": [ok, ok | {"layout": "tp=3", "num_devices": 4}]}))
    assert "tp degree 3 does not divide 4" in layout["points[1]"]["message"]
    too_big = _fields(_problem(client, BASE | {"points": [ok | {"num_devices": 8}]}))
    assert "exceeds cluster 'local-cpu' size" in too_big["points[0]"]["message"]
    dup = _fields(_problem(client, BASE | {"points": [ok, ok]}))
    assert "points[0]" in dup["points[1]"]["message"]
    both = _fields(_problem(client, BASE | {"points": [ok | {"tokens_per_sec_per_device": 5.0}]}))
    assert "exactly one" in both["points[0]"]["message"]
    env = _fields(_problem(client, BASE | {"points": [ok | {"environment": {"gpu": "x"}}]}))
    assert "torch_version" in env["points[0].environment.gpu"]["allowed"]
    new_cluster = _fields(_problem(client, BASE | {"cluster": "elsewhere", "points": [ok]}))
    assert set(new_cluster) == {"vendor", "device_name"}
    layout_form = _fields(_problem(client, BASE | {"points": [ok | {"layout": "zigzag"}]}))
    assert "points[0].layout" in layout_form


def test_an_imported_run_has_no_log_and_says_why(client) -> None:
    ok = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    r = client.post("/experiments/import", json=BASE | {"points": [ok]})
    assert r.status_code == 201, r.text
    log = client.get(f"/runs/{r.json()['runs'][0]['id']}/log")
    assert log.status_code == 404 and log.json()["detail"].endswith("(status succeeded; imported runs keep none)")


def test_a_vendor_that_contradicts_the_configured_cluster_is_a_422(client) -> None:
    ok = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    body = BASE | {"cluster": "local-cpu", "vendor": "nvidia", "device_name": "NVIDIA H100", "points": [ok]}
    r = client.post("/experiments/import", json=body)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "vendor", r.text
    assert r.json()["errors"][0]["allowed"] == ["cpu"]


def test_an_environment_world_size_other_than_num_devices_is_a_422(client) -> None:
    point = {"num_devices": 2, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    r = client.post("/experiments/import", json=BASE | {"points": [point | {"environment": {"world_size": 4}}]})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "points[0].environment.world_size"
    r = client.post("/experiments/import", json=BASE | {"points": [point | {"environment": {"world_size": 2}}]})
    assert r.status_code == 201, r.text


def test_writes_need_the_token(anon_client) -> None:
    ok = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    r = anon_client.post("/experiments/import", json=BASE | {"points": [ok]})
    assert r.status_code == 401
    assert r.json()["errors"][0]["field"] == "header.Authorization"


def test_unknown_device_has_no_mfu_and_loss_curves_are_thinned(client) -> None:
    curve = [5.0 - i * 1e-3 for i in range(1000)]
    points = [
        {
            "num_devices": n,
            "precision": p,
            "layout": "fsdp",
            # 256 tokens a step per device in 50 ms at bf16 (fp8: 1.2x the throughput, so a shorter step)
            "tokens_per_sec": 5120.0 * n * (1.2 if p != "bf16" else 1),
            "loss_curve": curve,
            "step_ms": 50.0 / (1.2 if p != "bf16" else 1),
        }
        for n in (1, 2)
        for p in ("bf16", "fp8-rowwise")
    ]
    exp = _import_raw(client, BASE | {"points": points})
    rep = r_ok(client.get(f"/experiments/{exp['id']}/scaling"))
    pt = rep["series"][0]["points"][0]
    assert pt["mfu_vs_bf16_peak"] is None and pt["step_ms_median"] == 50.0 and pt["final_loss"] == curve[-1]
    run = r_ok(client.get(f"/runs/{exp['runs'][0]['id']}"))
    assert run["summary"]["mfu_note"].startswith("no MFU: device 'cpu (gloo ranks)'")
    losses = r_ok(client.get(f"/experiments/{exp['id']}/losses"))
    assert len(losses["curves"]) == 4
    c = losses["curves"][0]
    assert c["num_steps"] == 1000 and len(c["steps"]) <= 200
    assert c["steps"][0] == 0 and c["steps"][-1] == 999 and c["losses"][-1] == curve[-1]
    only_2 = r_ok(client.get(f"/experiments/{exp['id']}/losses?num_devices=2&max_points=50"))
    assert {c["num_devices"] for c in only_2["curves"]} == {2}
    assert all(len(c["steps"]) <= 50 for c in only_2["curves"])


def _import_raw(client, body: dict) -> dict:
    r = client.post("/experiments/import", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/experiments/{r.json()['id']}"
    return r.json()


# ------------------------------------------------------------------------------ curves, seeds, verdicts


def _curve(seed: int, scale: float, num_steps: int = 1000, every: int = 1) -> list[list]:
    """A falling training-loss curve with per-step noise of its seed (same seed: same noise, as paired runs
    seeing the same batches), times `scale` (fp8's penalty)."""
    rng = random.Random(seed)
    noise = [rng.gauss(0.0, 0.02) for _ in range(num_steps)]
    return [[s, scale * (3.0 + 2.0 * math.exp(-s / 200) + noise[s])] for s in range(0, num_steps, every)]


def _seed_points(scale: float, seeds=(0, 1, 2), engine: str = "command:megatron") -> list[dict]:
    out = []
    for seed in seeds:
        for precision, factor in (("bf16", 1.0), ("fp8-rowwise", scale)):
            out.append(
                {
                    "num_devices": 1,
                    "precision": precision,
                    "layout": "fsdp",
                    "engine": engine,
                    "seed": seed,
                    "tokens_per_sec": 1000.0 * (1.08 if factor != 1.0 else 1.0),
                    "loss_curve": [v for _, v in _curve(seed, factor)],  # plain numbers: step 0, 1, 2, ...
                    "eval_curve": _curve(seed + 100, factor, every=50),  # [step, loss] pairs
                }
            )
    return out


def _fp8_verdict(client, exp_id: int) -> dict:
    rep = r_ok(client.get(f"/experiments/{exp_id}/scaling"))
    (sp,) = [s for s in rep["speedups"] if s["precision"] == "fp8-rowwise"]
    return sp


def test_imported_curves_and_seeds_get_the_fp8_verdict(client) -> None:
    """bf16 + fp8 points with 1,000-point curves and 3 seeds: the verdict reads the imported curves (stored
    where a measured run's are), pairs the seeds and prefers the held-out curve; a 0.1% gap tracks, 3% differs."""
    close = _import_raw(client, BASE | {"name": "close", "points": _seed_points(1.001)})
    assert {(r["engine"], r["seed"]) for r in close["runs"]} == {("command:megatron", s) for s in (0, 1, 2)}
    sp = _fp8_verdict(client, close["id"])
    assert sp["loss_verdict"] == "tracks", sp["loss_verdict_reason"]
    assert sp["loss_numerics"]["source"] == "eval" and "no fp8 loss curve" not in sp["loss_verdict_reason"]
    assert sp["loss_gap"] == pytest.approx(0.001, abs=5e-4)

    far = _import_raw(client, BASE | {"name": "far", "points": _seed_points(1.03)})
    sp = _fp8_verdict(client, far["id"])
    assert sp["loss_verdict"] == "differs", sp["loss_verdict_reason"]
    assert sp["loss_gap"] == pytest.approx(0.03, abs=5e-3)

    run = r_ok(client.get(f"/runs/{close['runs'][1]['id']}"))
    assert run["engine"] == "command:megatron" and run["seed"] == 0 and run["precision"] == "fp8-rowwise"
    evals = run["result"]["numerics"]["eval_curve"]
    assert len(evals) == 20 and evals[0]["step"] == 0


def test_losses_serve_every_seed_with_engine_and_csv(client) -> None:
    exp = _import_raw(client, BASE | {"name": "seeds", "points": _seed_points(1.001)})
    body = r_ok(client.get(f"/experiments/{exp['id']}/losses?max_points=1000"))
    got = [(c["precision"], c["seed"], c["engine"]) for c in body["curves"]]
    assert got == [(p, s, "command:megatron") for p in ("bf16", "fp8-rowwise") for s in (0, 1, 2)]
    c = body["curves"][0]
    assert c["steps"] == list(range(1000)) and c["source"] == "store"
    assert c["eval_steps"] == list(range(0, 1000, 50)) and len(c["eval_losses"]) == 20
    firsts = r_ok(client.get(f"/experiments/{exp['id']}/losses?repeats=first"))["curves"]
    assert [(c["precision"], c["seed"]) for c in firsts] == [(p, s) for p, s, _ in got]  # one repeat per seed here

    r = client.get(f"/experiments/{exp['id']}/losses?format=csv&max_points=2000")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 6 * 1000  # one row per run and step (the eval steps are training steps too)
    first = rows[0]
    assert (first["precision"], first["seed"], first["engine"], first["step"]) == ("bf16", "0", "command:megatron", "0")
    assert float(first["loss"]) == pytest.approx(_curve(0, 1.0)[0][1]) and first["eval_loss"] != ""
    assert rows[1]["eval_loss"] == ""
    etag = r.headers["etag"]
    assert client.get(r.url, headers={"If-None-Match": etag}).status_code == 304
    assert etag != client.get(f"/experiments/{exp['id']}/losses").headers["etag"]


def test_curve_forms_and_their_errors(client) -> None:
    ok = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    sparse = {"loss_curve": [[0, 5.0], [10, 4.0], [20, 3.5]], "eval_curve": [[9, 4.2], [19, 3.7]]}
    exp = _import_raw(client, BASE | {"points": [ok | sparse]})
    (c,) = r_ok(client.get(f"/experiments/{exp['id']}/losses"))["curves"]
    assert (c["steps"], c["losses"], c["eval_steps"]) == ([0, 10, 20], [5.0, 4.0, 3.5], [9, 19])
    assert r_ok(client.get(f"/experiments/{exp['id']}"))["spec"]["steps"] == 21

    mixed = _fields(_problem(client, BASE | {"points": [ok | {"loss_curve": [5.0, [1, 4.0]]}]}))
    assert "every value as a number" in mixed["points[0].loss_curve"]["message"]
    twice = _fields(_problem(client, BASE | {"points": [ok | {"eval_curve": [[5, 1.0], [5, 2.0]]}]}))
    assert "step 5 appears twice" in twice["points[0].eval_curve"]["message"]
    negative = _fields(_problem(client, BASE | {"points": [ok | {"eval_curve": [[-1, 1.0]]}]}))
    assert any(f.startswith("points[0].eval_curve") for f in negative)
    engine = _fields(_problem(client, BASE | {"points": [ok | {"engine": "megatron"}]}))
    assert "command:<name>" in engine["points[0].engine"]["message"]
    seed = _fields(_problem(client, BASE | {"points": [ok | {"seed": -1}]}))
    assert "points[0].seed" in seed
    dup = _fields(_problem(client, BASE | {"points": [ok | {"seed": 1}, ok | {"seed": 1}]}))
    assert "seed and repeat as points[0]" in dup["points[1]"]["message"]
    # the same point under two seeds or two engines is two runs
    two = _import_raw(client, BASE | {"points": [ok, ok | {"seed": 1}, ok | {"engine": "torchtitan"}]})
    assert sorted((r["engine"], r["seed"]) for r in two["runs"]) == [
        ("scalebench", 0),
        ("scalebench", 1),
        ("torchtitan", 0),
    ]


def test_a_step_time_that_contradicts_the_throughput_is_refused_by_name(client) -> None:
    # debug model, seq_len 256, one sequence a device: 256 tokens a step at N = 1, 1,000 tok/s -> 256 ms a step
    point = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
    r = client.post("/experiments/import", json=BASE | {"points": [point | {"step_ms": 50.0}]})
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["field"] == "points[0].step_ms"
    assert "contradicts tokens_per_sec 1000" in err["message"] and "256 ms" in err["message"]
    # within the tolerance for rounding it is kept as given
    kept = _import_raw(client, BASE | {"points": [point | {"step_ms": 260.0}]})
    run = r_ok(client.get(f"/runs/{kept['runs'][0]['id']}"))
    assert run["summary"]["step_ms_median"] == 260.0
