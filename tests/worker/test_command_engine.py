"""A command engine end to end: POST -> a real Celery worker -> runner.command -> torchrun of the operator's own
training script (examples/own-stack/train.py, gloo) -> its Megatron-style log parsed -> result in Postgres."""

from __future__ import annotations

import json
import sys

import pytest

from db.models import RunSummary
from tests.worker.conftest import REPO, submit

pytestmark = pytest.mark.slow


def _engines_toml() -> str:
    py = json.dumps(sys.executable)
    script = json.dumps(str(REPO / "examples" / "own-stack" / "train.py"))
    return f"""
[cluster.engines.own-stack]
argv = [{py}, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{{nproc_per_node}}", {script},
        "--seq-length", "{{seq_len}}", "--micro-batch-size", "{{local_batch_size}}", "--train-iters", "{{steps}}",
        "--seed", "{{seed}}", "--metrics-jsonl", "{{run_dir}}/metrics.jsonl", "{{precision_args}}"]
metrics = "megatron-log"
precisions = ["fp32", "bf16"]
precision_args = {{ bf16 = ["--bf16"] }}
env = {{ OMP_NUM_THREADS = "1" }}

[cluster.engines.own-stack-jsonl]
argv = [{py}, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{{nproc_per_node}}", {script},
        "--seq-length", "{{seq_len}}", "--train-iters", "{{steps}}", "--metrics-jsonl", "{{metrics_file}}"]
metrics = "jsonl"
precisions = ["fp32"]

[cluster.engines.silent]
argv = [{py}, "-c", "print('training went fine, trust me')"]
metrics = "megatron-log"
precisions = ["fp32"]
"""


@pytest.fixture
def command_cell(cell):
    with open(cell.settings.clusters_file, "a") as f:
        f.write(_engines_toml())
    return cell


def test_command_engine_runs_through_the_worker_and_its_log_is_read(command_cell, make_client, start_worker) -> None:
    cell = command_cell
    api = make_client(settings=cell.settings)
    start_worker()
    exp_id, run_ids = submit(
        api,
        cell,
        gpu_counts=[1, 2],
        steps=6,
        warmup_steps=1,
        engines=["scalebench", "command:own-stack", "command:own-stack-jsonl"],
    )
    runs = {rid: cell.wait_status(rid, ("succeeded", "failed"), timeout_s=240) for rid in run_ids}
    for run in runs.values():
        assert run.status == "succeeded", f"{run.engine}: {run.error_kind}: {run.error_message}"
    ours = [r for r in runs.values() if r.engine.startswith("command:")]
    assert len(ours) == 4
    with cell.session_factory() as s:
        for run in ours:
            summary = s.get(RunSummary, run.id)
            assert summary is not None and summary.tokens_per_sec > 0 and summary.num_timed_steps == 5
            source = "jsonl" if run.engine.endswith("jsonl") else "log:megatron"
            assert summary.step_time_source == f"the command's own figures ({source})"
            assert run.result["environment"]["engine"] == run.engine
            assert len(run.result["numerics"]["loss_curve"]) == 6
    log = api.get(f"/runs/{ours[0].id}/log").text
    assert "elapsed time per iteration (ms)" in log

    report = api.get(f"/experiments/{exp_id}/scaling").json()
    engines = {s["key"]["engine"] for s in report["series"]}
    assert engines == {"scalebench", "command:own-stack", "command:own-stack-jsonl"}
    ratios = {(r["engine"], r["num_devices"]) for r in report["engine_ratios"]}
    assert ratios == {(e, n) for e in ("command:own-stack", "command:own-stack-jsonl") for n in (1, 2)}
    csv = api.get(f"/experiments/{exp_id}/scaling?format=csv").text
    assert "command:own-stack" in csv and csv.splitlines()[0].startswith("engine,")


def test_a_command_that_prints_no_metric_fails_as_no_metrics_with_its_log(
    command_cell, make_client, start_worker
) -> None:
    cell = command_cell
    api = make_client(settings=cell.settings)
    start_worker()
    _, (run_id,) = submit(api, cell, engines=["command:silent"])
    run = cell.wait_status(run_id, ("succeeded", "failed"), timeout_s=120)
    assert run.status == "failed" and run.error_kind == "no_metrics", run.error_message
    assert "megatron-log parser" in run.error_message and "trust me" in run.error_message
