"""Engines as an axis: names, what each engine can run on a cluster, command templates, metric parsers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core.contracts.clusters import LOCAL_CPU, Cluster
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import ExperimentSpec, RunSpec, check_engine
from core.engines.command import CommandEngineConfig, render_command, template_values
from core.engines.logs import parse_metrics
from core.engines.registry import engine_names

BASE = {"name": "e", "model": "debug", "gpu_counts": [1, 2], "precisions": ["bf16", "fp8-tensorwise"]}
OWN = CommandEngineConfig(
    argv=[
        "torchrun",
        "--nproc-per-node",
        "{nproc_per_node}",
        "train.py",
        "--seq-length",
        "{seq_len}",
        "--train-iters",
        "{steps}",
        "{precision_args}",
        "--out={run_dir}/m.jsonl",
    ],
    metrics="megatron-log",
    precisions=["bf16", "fp8-tensorwise"],
    precision_args={"fp8-tensorwise": ["--fp8-format", "hybrid"]},
)
GPU = Cluster(
    name="gpu", vendor="nvidia", device_name="NVIDIA H200", gpus_per_node=8, torchtitan=True, engines={"own": OWN}
)


def test_engine_names_are_checked_and_deduplicated() -> None:
    assert check_engine(" torchtitan ") == "torchtitan"
    assert ExperimentSpec(**BASE, engines=["scalebench", "command:own", "scalebench"]).engines == [
        "scalebench",
        "command:own",
    ]
    for bad in ["megatron", "command:", "command:Bad Name", "titan", "command:a;rm -rf /"]:
        with pytest.raises(ValidationError, match="is not one of: scalebench, torchtitan, command:<name>"):
            ExperimentSpec(**BASE, engines=[bad])


def test_matrix_is_engine_x_precision_x_layout_x_n_x_seed_x_repeat() -> None:
    spec = ExperimentSpec(
        **BASE, cluster="gpu", engines=["scalebench", "torchtitan", "command:own"], seeds=[0, 1], repeats=2
    )
    runs, skipped = expand(spec, GPU)
    assert len(runs) == 3 * 2 * 1 * 2 * 2 * 2 and not skipped
    assert {r.engine for r in runs} == {"scalebench", "torchtitan", "command:own"}
    keys = {(r.engine, r.precision, r.num_devices, r.seed): r.run_key() for r in runs}
    assert len(set(keys.values())) == 3 * 2 * 2 * 2  # engine and seed are in the run key, the repeat is not


def test_the_default_engine_keeps_the_run_key_of_earlier_runs() -> None:
    spec = expand(ExperimentSpec(**BASE), LOCAL_CPU)[0][0]
    dumped = spec.model_dump(mode="json")
    old = {k: v for k, v in dumped.items() if k not in ("engine", "eval_every_steps", "eval_batches", "lr_schedule")}
    assert RunSpec.model_validate(old).run_key() == spec.run_key()
    assert spec.model_copy(update={"engine": "torchtitan"}).run_key() != spec.run_key()


def test_engines_a_cluster_does_not_offer_are_skipped_with_the_reason() -> None:
    spec = ExperimentSpec(**BASE, engines=["torchtitan", "command:own"])
    with pytest.raises(MatrixError) as info:
        expand(spec, LOCAL_CPU)
    reasons = {s.engine: s.reason for s in info.value.skipped}
    assert "does not offer engine torchtitan" in reasons["torchtitan"] and "pip install" in reasons["torchtitan"]
    assert "defines no command engine 'own'" in reasons["command:own"]
    assert engine_names(GPU) == ["scalebench", "torchtitan", "command:own"]


def test_a_command_engine_runs_only_its_precisions() -> None:
    spec = ExperimentSpec(**BASE | {"precisions": ["bf16", "fp8-rowwise"]}, cluster="gpu", engines=["command:own"])
    runs, skipped = expand(spec, GPU)
    assert {r.precision for r in runs} == {"bf16"}
    assert {s.reason for s in skipped} == {"command:own runs bf16, fp8-tensorwise, not fp8-rowwise"}


def test_command_template_is_rendered_from_the_run_spec() -> None:
    spec = next(
        r
        for r in expand(ExperimentSpec(**BASE, cluster="gpu", engines=["command:own"], seq_len=512, steps=30), GPU)[0]
        if r.precision == "fp8-tensorwise" and r.num_devices == 2
    )
    values = template_values(spec, nnodes=1, node_rank=0, master_addr="h0", master_port=29500, run_dir="/runs/7")
    out = render_command(OWN, spec, values)
    assert out["argv"] == [
        "torchrun",
        "--nproc-per-node",
        "2",
        "train.py",
        "--seq-length",
        "512",
        "--train-iters",
        "30",
        "--fp8-format",
        "hybrid",
        "--out=/runs/7/m.jsonl",
    ]
    assert out["cwd"] == "/runs/7" and out["metrics"] == "megatron-log"


def test_command_engines_refuse_unknown_placeholders_and_precisions() -> None:
    with pytest.raises(ValidationError, match=r"unknown placeholder\(s\) \{python\}; allowed: num_devices"):
        CommandEngineConfig(argv=["{python}", "train.py"], metrics="jsonl")
    with pytest.raises(ValidationError, match="precisions: 'fp9' not among"):
        CommandEngineConfig(argv=["x"], metrics="jsonl", precisions=["fp9"])
    with pytest.raises(ValidationError, match="must be a whole argument"):
        CommandEngineConfig(argv=["x", "--p={precision_args}"], metrics="jsonl")


MEGATRON = """\
[2026-12-04 01:00:00] iteration        1/      30 | consumed samples:  8 | elapsed time per iteration (ms): 912.3 | \
learning rate: 1.0E-04 | global batch size:     8 | lm loss: 1.041234E+01 | loss scale: 1.0 | grad norm: 9.1 |
some other line | iteration in a sentence
 iteration        2/      30 | consumed samples: 16 | elapsed time per iteration (ms): 431.5 | lm loss: 9.871E+00 |
"""
TITAN = (
    "\x1b[31mstep:  1  \x1b[32mloss: 10.8000  \x1b[33mmemory: 30.12GiB(31.70%)  \x1b[34mtps: 1,234  "
    "\x1b[35mtflops: 55.1  mfu: 5.57%\x1b[39m\nstep:  2  loss:  9.5000  memory: 30.12GiB(31.70%)  tps: 18,585\n"
)


def test_log_parsers_read_megatron_torchtitan_and_jsonl() -> None:
    m = parse_metrics("megatron-log", MEGATRON.splitlines(), tokens_per_step=8 * 4096, num_devices=8)
    assert [(r.step, r.step_ms, r.loss) for r in m] == [(1, 912.3, 10.41234), (2, 431.5, 9.871)]
    t = parse_metrics("torchtitan-log", TITAN.splitlines(), tokens_per_step=8 * 8192, num_devices=8)
    assert [r.step for r in t] == [1, 2] and t[1].loss == 9.5
    assert t[1].step_ms == pytest.approx(8192 / 18585 * 1000)  # tps is per device
    lines = [
        json.dumps({"step": 0, "tokens_per_sec": 1000.0, "loss": 3.0}),
        "not json",
        json.dumps([1]),
        json.dumps({"step": 1, "step_ms": 20.0}),
        json.dumps({"step": True, "step_ms": 1.0}),
    ]
    j = parse_metrics("jsonl", lines, tokens_per_step=100, num_devices=1)
    assert [(r.step, r.step_ms, r.loss) for r in j] == [(0, 100.0, 3.0), (1, 20.0, None)]
    assert parse_metrics("megatron-log", ["loss 3.0", "nothing to read"], tokens_per_step=1, num_devices=1) == []
