"""Feeding nights the way recorded results arrive: a suite experiment through the normal creation path,
then one RunResult per run through db.runs.record_result (no trainer involved)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

import db.runs
from core.contracts.clusters import LOCAL_CPU
from core.contracts.specs import ExperimentSpec, RunResult, RunSpec
from db.models import Suite
from db.suites import create_suite, create_suite_experiment

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
NOMINAL_TPS = {
    ("bf16", 1): 10000.0,
    ("bf16", 2): 19000.0,
    ("fp8-tensorwise", 1): 12000.0,
    ("fp8-tensorwise", 2): 22800.0,
}
ENV = {
    "vendor": "cpu",
    "device_name": "cpu",
    "device_count": 2,
    "world_size": 2,
    "torch_version": "2.13.0",
    "torchao_version": "0.18.0",
    "python_version": "3.11.2",
    "hosts": ["node-a"],
    "backend": "gloo",
}


def suite_spec(**overrides: Any) -> ExperimentSpec:
    fields: dict[str, Any] = dict(
        name="nightly",
        model="debug",
        gpu_counts=[1, 2],
        precisions=["bf16", "fp8-tensorwise"],
        layouts=["fsdp"],
        steps=4,
        warmup_steps=1,
    )
    return ExperimentSpec(**(fields | overrides))


def make_suite(
    session: Session,
    name: str = "nightly-debug",
    now: datetime = T0 - timedelta(days=1),
    spec: ExperimentSpec | None = None,
    **kwargs: Any,
) -> Suite:
    suite = create_suite(session, name=name, spec=spec or suite_spec(), cluster="local-cpu", now=now, **kwargs)
    session.commit()
    return suite


def result(
    spec: RunSpec,
    tps: float | None,
    env: dict,
    final_loss: float = 4.0,
    mem_gib: float = 2.0,
    curve: list[float] | None = None,
) -> RunResult:
    """One run's result; `curve` (the loss at steps 1..len) is recorded as step records and gives the final loss."""
    if tps is None:
        return RunResult.model_validate(
            {
                "run_key": spec.run_key(),
                "status": "failed",
                "environment": env,
                "error": {"kind": "oom", "message": "out of memory"},
            }
        )
    n = spec.num_devices
    summary = dict(
        num_timed_steps=3,
        tokens_per_step=2048 * n,
        tokens_per_sec=tps,
        tokens_per_sec_per_device=tps / n,
        step_ms_median=2048 * n / tps * 1000,
        step_ms_min=1.0,
        step_ms_max=2.0,
        flops_per_token=1000,
        tflops_per_device=0.1,
        peak_memory_allocated_gib=mem_gib,
    )
    if curve is not None:
        final_loss = curve[-1]
    return RunResult.model_validate(
        {
            "run_key": spec.run_key(),
            "status": "succeeded",
            "summary": summary,
            "numerics": {"final_loss": final_loss, "loss_curve": curve or [5.0, final_loss]},
            "steps": [{"step": i, "loss": loss} for i, loss in enumerate(curve or [], start=1)],
            "environment": env,
        }
    )


Values = Callable[[int, RunSpec], dict[str, Any]]  # (night, run spec) -> result() keyword overrides


def noisy(seed: int, noise: float = 0.03) -> Values:
    """Every run's throughput within +-noise of its nominal value (uniform, seeded)."""
    rng = random.Random(seed)

    def values(_night: int, spec: RunSpec) -> dict[str, Any]:
        tps = NOMINAL_TPS[(spec.precision, spec.num_devices)] * (1 + rng.uniform(-noise, noise))
        return {"tps": tps, "final_loss": 4.0 * (1 + rng.uniform(-0.004, 0.004))}

    return values


def add_night(session: Session, suite: Suite, night: int, values: Values) -> int:
    """Night `night` (T0 + night days): the suite's experiment and a recorded result for every run."""
    at = T0 + timedelta(days=night)
    exp, run_ids = create_suite_experiment(session, suite, LOCAL_CPU, now=at)
    session.commit()
    for run_id in run_ids:
        spec = RunSpec.model_validate(db.runs.get_run(session, run_id).spec)
        kwargs = {"env": ENV} | values(night, spec)
        db.runs.record_result(session, run_id, result(spec, **kwargs), now=at + timedelta(minutes=30))
    session.commit()
    return exp.id
