"""Small builders shared by the db and api tests."""

from __future__ import annotations

from sqlalchemy.orm import Session

from core.contracts.clusters import LOCAL_CPU
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec, RunResult
from db.experiments import create_experiment


def make_spec(**overrides) -> ExperimentSpec:
    base = dict(
        name="t",
        model="debug",
        gpu_counts=[1, 2, 4],
        precisions=["bf16", "fp8-tensorwise"],
        layouts=["fsdp"],
        steps=4,
        warmup_steps=1,
    )
    return ExperimentSpec(**(base | overrides))


def add_experiment(session: Session, **overrides) -> tuple[int, list[int]]:
    spec = make_spec(**overrides)
    runs, _ = expand(spec, LOCAL_CPU)
    exp, run_ids = create_experiment(session, spec, runs, LOCAL_CPU.queue_name)
    session.commit()
    return exp.id, run_ids


def succeeded_result(run_key: str = "k", num_steps: int = 4) -> RunResult:
    steps = [
        {"step": i, "loss": 5.0 - i * 0.1, "step_ms": 10.0 + i, "tokens": 2048, "warmup": i == 0}
        for i in range(num_steps)
    ]
    summary = dict(
        num_timed_steps=num_steps - 1,
        tokens_per_step=2048,
        tokens_per_sec=1.5e5,
        tokens_per_sec_per_device=7.5e4,
        step_ms_median=12.0,
        step_ms_min=11.0,
        step_ms_max=13.0,
        flops_per_token=123456789,
        tflops_per_device=0.5,
        mfu_note="unknown device cpu",
    )
    return RunResult.model_validate(
        {
            "run_key": run_key,
            "status": "succeeded",
            "steps": steps,
            "summary": summary,
            "numerics": {"final_loss": 4.7, "loss_curve": [5.0, 4.9, 4.8, 4.7]},
        }
    )


def failed_result(kind: str = "oom", message: str = "CUDA out of memory") -> RunResult:
    return RunResult.model_validate({"run_key": "k", "status": "failed", "error": {"kind": kind, "message": message}})
