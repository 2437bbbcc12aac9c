"""Failures are results: invalid_config, oom, comm_timeout, error (core.contracts.specs.ERROR_KINDS, runner part).

Steps measured before a failure are kept. A test hook, SCALEBENCH_FAULT="kind:step:rank" (kind one of
error, oom, hang), makes one rank fail after that step, so the failure paths run for real under torchrun.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from runner.env import DeviceInfo
    from runner.metrics import DeviceLog, StepTimer

from core.catalog.hardware import unsupported_reason
from core.contracts import data_paths
from core.contracts.specs import (
    MX_PRECISIONS,
    Environment,
    ErrorKind,
    Numerics,
    RunError,
    RunResult,
    RunSpec,
    StepRecord,
)
from core.engines.registry import scalebench_layout_reason

log = logging.getLogger(__name__)

FAULT_KINDS = ("error", "oom", "hang")


class InvalidConfig(ValueError):
    """The spec cannot run here; raised before any device work."""


class InjectedFault(RuntimeError):
    pass


def validate(spec: RunSpec, world_size: int) -> None:
    """Raise InvalidConfig naming the field and the reason. Device-free checks only."""
    d = spec.degrees
    problems = []
    if world_size != d.world_size:
        problems.append(f"degrees.world_size({d.world_size}) != launched world size({world_size})")
    if d.dp_mode == "none" and d.dp_degree > 1:
        problems.append(f"dp_mode none with dp_replicate({d.dp_replicate}) * dp_shard({d.dp_shard}) > 1")
    shape = spec.shape
    for field, value in (
        ("num_heads", shape.num_heads),
        ("num_kv_heads", shape.num_kv_heads),
        ("ffn_hidden_dim", shape.ffn_hidden_dim),
        ("vocab_size", shape.vocab_size),
        ("seq_len", spec.seq_len),
    ):
        if value % d.tp:
            problems.append(f"{field}({value}) of model {spec.model} is not divisible by tp({d.tp})")
    problems += mx_problems(spec)
    if spec.engine == "scalebench":  # runner.titan adds TorchTitan's own rules (runner.titan_config)
        layout_reason = scalebench_layout_reason(
            d, num_layers=shape.num_layers, local_batch_size=spec.local_batch_size, seq_len=spec.seq_len
        )
        if layout_reason:
            problems.append(f"layout: {layout_reason}")
    if spec.data_path:
        try:  # checked again on the open descriptor when it is read (runner.data.open_data)
            data_paths.resolve(spec.data_path, spec.data_roots)
        except data_paths.DataPathError as exc:
            problems.append(str(exc))
    if spec.device_type == "cuda":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if not torch.cuda.is_available():
            problems.append("device_type cuda, but torch sees no CUDA/ROCm device")
        elif torch.cuda.device_count() < local_world:
            problems.append(f"{local_world} ranks on this host but only {torch.cuda.device_count()} devices")
        else:
            vendor = "amd" if torch.version.hip else "nvidia"
            reason = unsupported_reason(spec.precision, vendor, torch.cuda.get_device_name())
            if reason:
                problems.append(f"precision: {reason}")
    if problems:
        raise InvalidConfig("; ".join(problems))


def mx_problems(spec: RunSpec) -> list[str]:
    """MX recipes scale blocks of 32 along every GEMM's reduction dim, the token dim included (weight grads)."""
    if spec.precision not in MX_PRECISIONS:
        return []
    problems = []
    tokens = spec.local_batch_size * spec.seq_len
    if tokens % 32:
        problems.append(f"precision {spec.precision}: local_batch_size * seq_len ({tokens}) is not divisible by 32")
    if spec.degrees.tp > 1:
        problems.append(
            f"precision {spec.precision}: MX recipes run without tensor parallelism here (tp({spec.degrees.tp}) > 1)"
        )
    return problems


def classify(exc: BaseException) -> ErrorKind:
    if isinstance(exc, InvalidConfig):
        return "invalid_config"
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    if isinstance(exc, (dist.DistBackendError, TimeoutError)):
        return "comm_timeout"
    text = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("timed out" in text or "timeout" in text):
        return "comm_timeout"  # gloo: "Timed out waiting ... for recv operation to complete"
    return "error"


class RunState:
    """What a run has gathered so far; failed_result turns it into a result."""

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.device: torch.device | None = None
        self.created_group = False
        self.info: DeviceInfo | None = None
        self.environment: Environment | None = None
        self.timer: StepTimer | None = None
        self.device_log: DeviceLog | None = None
        self.num_float8_linears: int | None = None
        self.lrs: list[float] = []
        self.result: RunResult | None = None
        self.failed = False

    def cleanup(self) -> None:
        # After a communication failure a collective may never return: leave the group to process exit.
        if self.created_group and not self.failed and dist.is_initialized():
            # All ranks leave together: a rank tearing down gloo pairs while a peer still uses them can
            # abort that peer ("connection closed by peer").
            dist.barrier()
            dist.destroy_process_group()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()


def failed_result(spec: RunSpec, state: RunState, exc: BaseException) -> RunResult:
    from core.analysis.summary import step_records
    from runner.metrics import memory_at_failure

    state.failed = True
    kind = classify(exc)
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    log.error("run failed (%s): %s\n%s", kind, exc, tail)
    memory = memory_at_failure(state.device) if kind == "oom" and state.device is not None else None
    steps: list[StepRecord] = []
    numerics: Numerics | None = None
    device_log = state.device_log
    if state.timer is not None and device_log is not None:  # set together
        step_ms = _safe(state.timer.step_ms, [])
        # Local losses only: a reduce could hang on a broken group.
        losses, norms = _safe(lambda: device_log.read(reduce=False), ([], []))
        steps = step_records(step_ms, losses, norms, state.lrs, spec.tokens_per_step, spec.warmup_steps)
        if losses:
            numerics = Numerics(final_loss=losses[-1], loss_curve=losses)
    error = RunError(kind=kind, message=f"{type(exc).__name__}: {exc}"[:20000], traceback_tail=tail, memory=memory)
    return RunResult(
        run_key=spec.run_key(),
        status="failed",
        steps=steps,
        numerics=numerics,
        environment=state.environment,
        error=error,
    )


def _safe(fn, default):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - collecting what survived a failure
        log.warning("could not collect partial metrics: %s", exc)
        return default


# ------------------------------------------------------------------------------------- test hook


def fault_from_env() -> tuple[str, int, int] | None:
    raw = os.environ.get("SCALEBENCH_FAULT")
    if not raw:
        return None
    kind, step, rank = raw.split(":")
    if kind not in FAULT_KINDS:
        raise InvalidConfig(f"SCALEBENCH_FAULT kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
    return kind, int(step), int(rank)


def maybe_inject(fault: tuple[str, int, int] | None, step: int) -> None:
    if fault is None or fault[1] != step:
        return
    kind, _, rank = fault
    if (dist.get_rank() if dist.is_initialized() else 0) != rank:
        return
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected out-of-memory after step {step}")
    if kind == "hang":
        log.warning("injected hang after step %d", step)
        time.sleep(3600)
    raise InjectedFault(f"injected error after step {step}")
