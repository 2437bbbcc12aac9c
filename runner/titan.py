"""`python -m runner.titan --spec spec.json --out result.json`: engine torchtitan, TorchTitan's own Trainer.

Same command line, result writing and exit code as `python -m runner` (runner.__main__.main): rank 0 writes
result.json, a failing peer leaves its error for rank 0, failures are results (runner.failures). Steps:

1. a spec TorchTitan 0.2.2 cannot run is refused with the reason (runner.titan_config.run_reason, the rule
   the POST-time check applies too): invalid_config;
2. TorchTitan must import (the `torchtitan` extra); if it is absent the run fails as invalid_config;
3. the job config: runner.titan_config's TOML for the RunSpec, written beside result.json as titan.toml (what
   TorchTitan read), parsed by TorchTitan's own ConfigManager;
4. TorchTitan's Trainer trains, unchanged: its model (our shape, runner.titan_spec), parallelisms, float8
   converter, compile, AdamW, LR schedule and loss, on runner.data's batches, from our runner's initial weights;
5. measured as our runner measures: a CUDA event after every optimizer step (a global optimizer-step hook; the
   device is synchronized once, when the times are read), the loss and grad norm of every step kept on the
   device, the peak memory over the training steps; TorchTitan's own tps/MFU log is not used. The RunResult
   comes from core.analysis.summary as for our runner, with environment.engine "torchtitan" and its version.

Engine parity: on the same RunSpec both engines train on the same batch at every step (runner.data, addressed by
seed, step and global sequence index, served through TorchTitan's dataloader), start from the same weights
(runner.model.init_parameters: TorchTitan's llama3 distribution, drawn per parameter name from the seed, in
both), and use the same AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every parameter), grad-norm clip
1.0, LR warm-up and decay (runner.titan_config.lr_scheduler) and mean token cross-entropy in fp32
(tests/runner/test_engine_parity.py: batches, weights and first losses). What differs is arithmetic, not the
recipe: without FSDP (one device, DDP) our residual stream is bf16 under autocast (torchao's gw-hp recipe needs
one dtype), TorchTitan's stays fp32; our RMSNorm computes in fp32, TorchTitan's is torch.nn.RMSNorm; our fused
AdamW applies the clip factor inside its kernel, TorchTitan clips then steps; the compiled graphs differ. So bf16
losses agree closely for the first ~100 steps and then drift apart as rounding differences grow, the per-step
losses still co-varying (bench/results/2026-12-04-time-to-loss-h200.md).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from core.contracts.specs import Numerics, RunResult, RunSpec
from runner import titan_config

log = logging.getLogger("runner.titan")

TORCHTITAN_MISSING = "torchtitan is not installed on this node: pip install '.[torchtitan]'"
STEP_TIME_SOURCE = "optimizer-step hook"


class OptimizerStepClock:
    """A CUDA event (the host clock on CPU) after every AdamW step, from a global optimizer-step hook.

    Works for any train loop that calls torch.optim.AdamW.step once a step (TorchTitan's OptimizersContainer
    steps one AdamW per model part; the container itself is not an AdamW). mark() adds a mark by hand (the
    start of the first step). CUDA: events only, no sync per step; step_ms() synchronizes once. `also` runs
    after each mark (a profiler's step)."""

    def __init__(self, device_type: str, also: Callable[[], None] | None = None):
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch, self.cuda = torch, device_type == "cuda"
        self.marks: list = []
        self.also = also
        self.handle = register_optimizer_step_post_hook(self._hook)

    def mark(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def _hook(self, optimizer, args, kwargs) -> None:
        if not isinstance(optimizer, self.torch.optim.AdamW):
            return
        self.mark()
        if self.also is not None:
            self.also()

    def close(self) -> None:
        """Stop marking (the hook is global: remove it when the run ends)."""
        self.handle.remove()

    def step_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (CUDA: CPU-GPU sync point, once)."""
        if len(self.marks) < 2:
            return []
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1000 for a, b in zip(self.marks, self.marks[1:])]


def torchtitan_version() -> str:
    """TorchTitan's version; InvalidConfig when it is not installed or does not import."""
    from runner.failures import InvalidConfig

    try:
        torchtitan = importlib.import_module("torchtitan")
    except ImportError as exc:
        if exc.name == "torchtitan":
            raise InvalidConfig(TORCHTITAN_MISSING) from exc
        raise InvalidConfig(f"torchtitan does not import on this node: {type(exc).__name__}: {exc}") from exc
    return torchtitan.__version__


def single_process_env() -> None:
    """Outside torchrun (one process, e.g. a test): the env:// rendezvous TorchTitan's Trainer expects."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def write_job_toml(spec: RunSpec, run_dir: Path, comm_timeout_s: float) -> Path:
    """run_dir/titan.toml (every rank writes the same text; atomic rename)."""
    text = titan_config.job_toml(spec, dump_folder=str(run_dir / "titan"), comm_timeout_s=int(comm_timeout_s))
    (run_dir / "titan").mkdir(parents=True, exist_ok=True)
    path = run_dir / "titan.toml"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def run(spec: RunSpec, run_dir: Path | None = None) -> RunResult:
    """Train one RunSpec with TorchTitan's Trainer; every rank returns a RunResult (rank 0's is written)."""
    from runner import failures
    from runner.train import comm_timeout_s, world_size_from_env

    state = failures.RunState(spec)
    version = None
    try:
        if reason := titan_config.run_reason(spec):  # pure: refused the same way with or without TorchTitan
            raise failures.InvalidConfig(reason)
        version = torchtitan_version()
        toml_path = write_job_toml(spec, run_dir or Path.cwd(), comm_timeout_s())
        failures.validate(spec, world_size_from_env())  # world size, divisibility, devices: before device work
        _run(spec, state, toml_path, version)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result
        result = failures.failed_result(spec, state, exc)
        if result.environment is not None:
            result = result.model_copy(
                update={
                    "environment": result.environment.model_copy(
                        update={"engine": "torchtitan", "torchtitan_version": version}
                    )
                }
            )
        return result
    finally:
        state.cleanup()
    assert state.result is not None
    return state.result


def _local(t):
    """A DTensor's full value (TorchTitan's loss under loss-parallel TP is one), else the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run(spec: RunSpec, state, toml_path: Path, version: str) -> None:
    import torch
    import torch.distributed as dist
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import utils as titan_dist
    from torchtitan.train import Trainer

    import runner.titan_spec  # noqa: F401 - registers the train spec (the Trainer's custom_import does it too)
    from core.analysis.summary import step_records, summarize
    from runner.env import capture_environment, gather_hosts, peaks_for, probe_device
    from runner.fp8 import fp8_dtypes_of_config
    from runner.metrics import DeviceLog, peak_memory_gib

    if spec.profile_steps:
        log.warning("profile_steps(%d) ignored: engine torchtitan records no profiler trace", spec.profile_steps)
    single_process_env()
    config = ConfigManager().parse_args(titan_config.cli_args(str(toml_path)))
    trainer = Trainer(config)  # process group, mesh, model, float8 conversion, compile, FSDP/TP, optimizer
    state.created_group = dist.is_initialized()
    state.device = device = trainer.device
    info = probe_device(spec.device_type)
    state.info = info
    hosts = gather_hosts(spec.num_devices)  # collective: all ranks, once
    model = trainer.model_parts[0]
    float8_linears = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
    fp8_dtypes = fp8_dtypes_of_config(float8_linears[0].config) if float8_linears else []
    state.num_float8_linears = len(float8_linears)
    state.environment = capture_environment(
        info,
        hosts=hosts,
        world_size=spec.num_devices,
        backend=dist.get_backend(),
        fp8_dtypes=fp8_dtypes,
    ).model_copy(update={"engine": "torchtitan", "torchtitan_version": version})

    # Per step, without touching TorchTitan's loop: the LR and the loss from forward_backward_step (one
    # micro-batch a step: runner.titan_config sets global = local x dp), the grad norm from its clip_grad_norm_.
    # A rank's TorchTitan loss is its token sum over the global token count; times the data-parallel degree it
    # is the rank's own mean, which DeviceLog averages over ranks as for our runner.
    device_log = DeviceLog()
    state.device_log = device_log
    losses_pending: list = []
    dp_degree = spec.degrees.dp_degree
    first = [True]
    forward_backward_step = trainer.forward_backward_step
    clip_grad_norm_ = titan_dist.clip_grad_norm_

    def forward_backward_step_measured(**kwargs):
        if first[0] and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # as our runner: the peak over the training steps
            first[0] = False
        state.lrs.append(trainer.lr_schedulers.schedulers[0].get_last_lr()[0])
        loss = forward_backward_step(**kwargs)
        losses_pending.append(_local(loss.detach()))
        return loss

    def clip_grad_norm_measured(*args, **kwargs):
        norm = clip_grad_norm_(*args, **kwargs)
        loss = losses_pending.pop() if losses_pending else torch.tensor(float("nan"), device=device)
        device_log.add(loss * dp_degree, _local(norm))  # stays on the device: no sync here
        return norm

    trainer.forward_backward_step = forward_backward_step_measured
    # TorchTitan resets the peak at every log line; keep one peak over the whole run instead.
    trainer.metrics_processor.device_memory_monitor.reset_peak_stats = lambda: None
    clock = OptimizerStepClock(spec.device_type)
    state.timer = clock
    titan_dist.clip_grad_norm_ = clip_grad_norm_measured
    try:
        clock.mark()  # the start of the first step
        trainer.train()
    finally:
        titan_dist.clip_grad_norm_ = clip_grad_norm_
        clock.close()
    step_ms = clock.step_ms()
    losses, norms = device_log.read(reduce=True)
    memory = peak_memory_gib(device)
    trainer.close()

    shape = spec.shape  # the layer and vocabulary overrides included
    bf16_peak, own_peak, mfu_note = peaks_for(info, spec.precision)
    summary = summarize(
        step_ms,
        warmup_steps=spec.warmup_steps,
        tokens_per_step=spec.tokens_per_step,
        num_devices=spec.num_devices,
        flops_per_token=shape.flops_per_token(spec.seq_len),
        bf16_peak=bf16_peak,
        own_peak=own_peak,
        mfu_note=mfu_note,
        memory=memory,
        num_float8_linears=len(float8_linears),
        step_time_source=STEP_TIME_SOURCE,
    )
    steps = step_records(step_ms, losses, norms, state.lrs, spec.tokens_per_step, spec.warmup_steps)
    state.result = RunResult(
        run_key=spec.run_key(),
        status="succeeded",
        steps=steps,
        summary=summary,
        numerics=Numerics(final_loss=losses[-1] if losses else None, loss_curve=losses),
        environment=state.environment,
    )
    log.info(
        "done: %.0f tokens/s, %.1f ms/step median (torchtitan %s)",
        summary.tokens_per_sec,
        summary.step_ms_median,
        version,
    )


def main(argv: list[str] | None = None):
    from runner.__main__ import main as runner_main

    runner_main(argv, prog="python -m runner.titan", train=run)


if __name__ == "__main__":
    sys.exit(main())
