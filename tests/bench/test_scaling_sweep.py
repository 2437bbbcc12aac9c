"""bench/scaling_sweep.py pieces on CPU: the YAML's plan on one GPU, and the import bodies the API accepts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from api.routers.imports import ExperimentImport
from core.contracts.specs import Environment, Numerics, RunResult, StepRecord, Summary

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("scaling_sweep", REPO / "bench" / "scaling_sweep.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)
CONFIG = REPO / "examples" / "h200-scaling.yaml"


def test_plan_on_one_gpu_runs_the_three_n1_points_bf16_first_and_names_the_rest():
    cluster, exps, fallback = sweep.load_config(CONFIG, smoke=False, num_devices=1)
    assert (cluster.vendor, cluster.device_name, cluster.gpus_per_node, fallback) == ("nvidia", "NVIDIA H200", 1, 24)
    order, members, not_run, impossible = sweep.plan(cluster, exps, num_devices=1)
    assert [(r.precision, r.layout, r.num_devices) for r in order] == [
        ("bf16", "fsdp", 1),
        ("fp8-tensorwise", "fsdp", 1),
        ("fp8-rowwise", "fsdp", 1),
    ]
    tw = order[1]
    assert tw.fp8_all_gather and tw.precompute_fp8_scales and not order[2].fp8_all_gather
    assert all(r.num_layers == 28 and r.seq_len == 8192 and r.compile and r.device_type == "cuda" for r in order)
    # bf16 is in both experiments with one run key: 2 experiments x 2 precisions x (fsdp 4 + tp=2+fsdp 3) points
    assert len(members) == 28 and len({(r.run_key(), r.repeat) for _, r in members}) == 21
    assert "fp8-rowwise/tp=2+fsdp N=2,4,8: only 1 GPUs present" in not_run and len(not_run) == 6
    assert "bf16/tp=2+fsdp/N=1: tp degree 2 does not divide 1 devices" in impossible


def test_plan_on_eight_gpus_runs_everything():
    cluster, exps, _ = sweep.load_config(CONFIG, smoke=False, num_devices=8)
    order, _, not_run, _ = sweep.plan(cluster, exps, num_devices=8)
    assert len(order) == 21 and not not_run
    assert [r.num_devices for r in order] == sorted(r.num_devices for r in order)


def test_import_bodies_validate_against_the_api_schema():
    cluster, exps, _ = sweep.load_config(CONFIG, smoke=True, num_devices=2)
    order, members, _, _ = sweep.plan(cluster, exps, num_devices=2)
    env = Environment(vendor="cpu", device_name="x86_64", device_count=1, torch_version="2.13.0", world_size=1)
    done = {}
    for r in order:
        s = Summary(
            num_timed_steps=3,
            tokens_per_step=r.tokens_per_step,
            tokens_per_sec=100.0 * r.num_devices,
            tokens_per_sec_per_device=100.0,
            step_ms_median=640.0,
            step_ms_min=600.0,
            step_ms_max=700.0,
            flops_per_token=1,
            tflops_per_device=0.0,
        )
        done[(r.run_key(), r.repeat)] = RunResult(
            run_key=r.run_key(),
            status="succeeded",
            summary=s,
            steps=[StepRecord(step=0, loss=8.0)],
            environment=env,
            numerics=Numerics(final_loss=8.0, loss_curve=[8.0]),
        )
    bodies = [sweep.import_body(e, cluster, done, members, i) for i, e in enumerate(exps)]
    parsed = [ExperimentImport.model_validate(b) for b in bodies]
    assert parsed[0].fp8_all_gather and {p.precision for p in parsed[0].points} == {"bf16", "fp8-tensorwise"}
    assert {p.precision for p in parsed[1].points} == {"bf16", "fp8-rowwise"}
    assert sorted((p.layout, p.num_devices) for p in parsed[1].points if p.precision == "bf16") == [
        ("fsdp", 1),
        ("fsdp", 2),
        ("tp=2+fsdp", 2),
    ]
    report = sweep.build_report([sweep.run_point(i, r, done[(r.run_key(), r.repeat)]) for i, r in enumerate(order)])
    assert {sp.precision for sp in report.speedups} == {"fp8-tensorwise", "fp8-rowwise"}
