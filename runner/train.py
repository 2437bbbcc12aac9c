"""One run: validate, set up the process group and mesh, build the model, train, measure, return a RunResult.

`run(spec)` works in-process (one rank, e.g. the GPU bench or a test) and under torchrun (every rank calls
it; rank 0's result is the one written). Failures are results: see runner.failures.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from core.analysis.summary import step_records, summarize
from core.contracts.specs import EvalPoint, Numerics, RunResult, RunSpec
from runner import failures
from runner.context import LocalPieces
from runner.corpus import describe
from runner.data import Batches, make_batches, make_eval_batches, resolve_data
from runner.env import capture_environment, expected_fp8_dtypes, gather_hosts, peaks_for, probe_device
from runner.fp8 import fp8_dtypes_of_config, is_fp8, precompute_fp8_scales
from runner.metrics import DeviceLog, StepTimer, peak_memory_gib
from runner.model import Llama, init_weights
from runner.parallel import build_mesh, parallelize, uses_dp_wrapper
from runner.pipeline import Pipeline, clip_across_stages, loss_ranks
from runner.profiling import StepProfiler

log = logging.getLogger(__name__)

MAX_GRAD_NORM = 1.0
DEFAULT_COMM_TIMEOUT_S = 600
# Apply the clip factor inside the fused AdamW kernel (its grad_scale input) instead of a separate multiply over
# every gradient: the fused kernel then writes the clipped gradients back, so per parameter 4 bytes of the separate
# pass's 8 are saved. Profiled on one H200 (8B dims, 16 layers): optimizer kernels 70.0 ms a step (TorchTitan,
# clip_grad_norm_) vs 65.4 ms. A switch for the GPU bench's A/B runs.
CLIP_IN_FUSED_OPTIMIZER = True


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "constant") -> float:
    """Multiplier of the peak LR: linear warm-up over warmup_steps, then constant or cosine to 10%."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def clip_in_optimizer(optimizer: torch.optim.Optimizer, params: list, max_norm: float) -> torch.Tensor:
    """Gradient clipping folded into a fused AdamW step: returns the total grad norm (as clip_grad_norm_).

    The clip factor min(1, max_norm / (norm + 1e-6)) becomes the optimizer's grad_scale, which the fused kernel
    divides every gradient by as it loads it (the GradScaler path of fused optimizers): the same update as
    clip_grad_norm_ then step(), without the separate read-modify-write of all fp32 gradients. Plain (non-DTensor)
    parameters and fused=True only."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
    clip_coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    optimizer.grad_scale = clip_coef.reciprocal()  # type: ignore[attr-defined]  # read by AdamW.step (getattr)
    return norm


def cross_entropy_fp32(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in fp32 over (bs, seq, vocab) logits: the largest activation of the step."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# ------------------------------------------------------------------------------------------- setup


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def comm_timeout_s() -> float:
    return float(os.environ.get("SCALEBENCH_COMM_TIMEOUT_S", DEFAULT_COMM_TIMEOUT_S))


def init_distributed(device_type: str) -> tuple[torch.device, bool]:
    """Process group with a finite timeout. Returns (this rank's device, whether we created the group)."""
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # Tear down communicators on a timeout and raise in the caller, instead of aborting the process.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        return device, False
    backend = "nccl" if device_type == "cuda" else "gloo"
    timeout = timedelta(seconds=comm_timeout_s())
    if "RANK" in os.environ:  # torchrun: env:// rendezvous
        dist.init_process_group(backend, timeout=timeout, device_id=device if device_type == "cuda" else None)
    else:  # a single process without torchrun: an in-memory store, no port
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return device, True


def build_model(spec: RunSpec, mesh, device: torch.device):
    """Build on meta, convert and parallelize, materialize, initialize. Returns (model, facts)."""
    shape = spec.shape
    with torch.device("meta"):
        model = Llama(shape, max_seq_len=spec.seq_len)
    facts = parallelize(model, mesh, spec)
    model.to_empty(device=device)
    init_weights(model, spec.seed)
    model.train()
    return model, facts


def dp_rank_of(mesh, spec: RunSpec) -> int:
    _, rep, shard, _, _ = mesh.get_coordinate()
    return rep * spec.degrees.dp_shard + shard


def autocast_context(spec: RunSpec, device: torch.device):
    """bf16 compute over fp32 master weights when no data-parallel wrapper does the cast."""
    if spec.precision == "fp32" or uses_dp_wrapper(spec.degrees):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


# -------------------------------------------------------------------------------------------- run


def inductor_settings(precision: str) -> dict:
    """Inductor config for the compiled blocks of a precision, held for the whole run (compiles are lazy).

    fp8-rowwise: emulate_precision_casts. Without it inductor drops bf16 round trips between fused ops and, in the
    rowwise backward, materializes the SwiGLU gradient in fp32 (a 8192 x 14336 fp32 buffer per layer at the bench
    shape, read again by the column-wise amax and cast kernels); with it that tensor stays bf16. Measured on one
    H200 (8B dims, 16 layers, 8192 tokens): 423.3 -> 406.5 ms a step. TorchTitan's float8 converter sets the same
    flag for this recipe (as a numerics fix, pytorch#150859). Not for fp8-tensorwise: 375.7 -> 391.9 ms there;
    not measured for fp8-rowwise-gw-hp, so left off (as TorchTitan does)."""
    return {"emulate_precision_casts": True} if precision == "fp8-rowwise" else {}


def _inductor_patch(settings: dict):
    if not settings:
        return contextlib.nullcontext()  # inductor's config module imports dynamo: ~0.5 s of a CPU rank's start
    import torch._inductor.config as inductor_config

    return inductor_config.patch(settings)


def run(spec: RunSpec, trace_dir: Path | None = None) -> RunResult:
    """Train one RunSpec and return its RunResult (every rank returns one; rank 0's is authoritative).
    trace_dir: where each rank writes its profiler trace when spec.profile_steps > 0."""
    state = failures.RunState(spec)
    try:
        failures.validate(spec, world_size_from_env())  # invalid_config: before any device work
        device, created = init_distributed(spec.device_type)
        state.device, state.created_group = device, created
        with _inductor_patch(inductor_settings(spec.precision)):  # restored after the run
            _run(spec, state, trace_dir)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result
        return failures.failed_result(spec, state, exc)
    finally:
        state.cleanup()
    assert state.result is not None  # _run sets it when it returns
    return state.result


def eval_due(step: int, spec: RunSpec) -> bool:
    """Evaluate after this (0-based) step: every eval_every_steps steps and after the last."""
    every = spec.eval_every_steps
    return bool(every) and ((step + 1) % every == 0 or step == spec.steps - 1)


def evaluate(model, eval_batches, num_batches: int, amp, loss_fn) -> torch.Tensor:
    """Mean held-out loss of this rank over num_batches batches, a 0-d device tensor (no CPU-GPU sync). model: the
    model, or this rank's Pipeline (0 on the stages before the last)."""
    total: torch.Tensor | None = None
    with torch.no_grad():
        for b in range(num_batches):
            inputs, labels = eval_batches.get(b)
            if isinstance(model, Pipeline):
                with amp:
                    loss = model.eval_loss(inputs, labels)
            else:
                with amp:
                    logits = model(inputs)
                loss = loss_fn(logits, labels).detach().float()
                del logits
            total = loss if total is None else total + loss
    assert total is not None, "num_batches must be >= 1"
    return total / num_batches


def read_eval_losses(losses: list[torch.Tensor], holders: int) -> list[float]:
    """Per evaluation, the mean over the `holders` ranks that hold a loss (all, or the last pipeline stage's; the
    others hold 0) = over DP ranks: TP ranks of a DP group score the same batch."""
    if not losses:
        return []
    stacked = torch.stack(losses)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        stacked = stacked / holders
    return stacked.cpu().tolist()  # CPU-GPU sync point (once)


def data_description(spec: RunSpec) -> str:
    """Numerics.data: "synthetic", or the token file's name and sha256 with its corpus and tokenizer recipe."""
    if not spec.data_path:
        return "synthetic"
    return describe(resolve_data(spec.data_path, spec.data_roots), name=spec.data_path)


def _run(spec: RunSpec, state: failures.RunState, trace_dir: Path | None) -> None:
    device = state.device
    assert device is not None  # run() sets it before
    torch.manual_seed(spec.seed)
    mesh = build_mesh(spec.device_type, spec.degrees)
    info = probe_device(spec.device_type)
    state.info = info
    hosts = gather_hosts(spec.num_devices)  # collective: all ranks, once
    model, facts = build_model(spec, mesh, device)
    fp8_dtypes = fp8_dtypes_of_config(facts["fp8_config"]) if facts["fp8_config"] else []
    if fp8_dtypes and info.vendor != "cpu" and not set(fp8_dtypes) <= set(expected_fp8_dtypes(info)):
        log.warning(
            "fp8 dtypes %s differ from the expected %s on %s", fp8_dtypes, expected_fp8_dtypes(info), info.device_name
        )
    state.environment = capture_environment(
        info, hosts=hosts, world_size=spec.num_devices, backend=dist.get_backend(), fp8_dtypes=fp8_dtypes
    )
    shape = spec.shape
    batches: Batches | LocalPieces = make_batches(spec, shape.vocab_size, dp_rank_of(mesh, spec), device)
    eval_batches: Batches | LocalPieces | None = (
        make_eval_batches(spec, shape.vocab_size, dp_rank_of(mesh, spec), device) if spec.eval_every_steps else None
    )
    if model.context is not None:  # context parallel: this rank's pieces of every sequence
        batches = LocalPieces(batches, model.context)
        eval_batches = LocalPieces(eval_batches, model.context) if eval_batches is not None else None
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=device.type == "cuda",
        foreach=device.type != "cuda",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, spec.lr_warmup_steps, spec.steps, spec.lr_schedule)
    )
    precompute = spec.precompute_fp8_scales and facts.get("fp8_all_gather", False)
    params = list(model.parameters())
    fused = device.type == "cuda"
    clip_fused = CLIP_IN_FUSED_OPTIMIZER and fused and not any(isinstance(p, DTensor) for p in params)
    amp = autocast_context(spec, device)
    # Compiled, the fp32 upcast fuses into the log-softmax: no fp32 copy of the (tokens, vocab) logits.
    loss_fn = torch.compile(cross_entropy_fp32) if spec.compile else cross_entropy_fp32
    pipeline = Pipeline(model, mesh, spec, device, loss_fn) if spec.degrees.pp > 1 else None
    if pipeline is not None and facts["num_float8_linears"] is not None:
        facts["num_float8_linears"] = pipeline.count_over_stages(facts["num_float8_linears"])  # the whole model's
    holders = loss_ranks(spec, dist.get_world_size())
    timer, device_log = StepTimer(device), DeviceLog(holds_loss=pipeline is None or pipeline.last)
    state.timer, state.device_log, state.num_float8_linears = timer, device_log, facts["num_float8_linears"]
    log_every = max(1, spec.steps // 10)
    fault = failures.fault_from_env()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    profiler = StepProfiler(spec, device, trace_dir)  # the last spec.profile_steps steps; no-op when 0

    # Evaluations run between two timer marks; those intervals (eval_intervals: indices into timer.step_ms())
    # are dropped before the figures, so eval is outside the timed steps.
    eval_steps: list[int] = []
    eval_losses: list[torch.Tensor] = []
    eval_intervals: set[int] = set()
    timer.mark()
    for step in range(spec.steps):
        profiler.begin(step)
        inputs, labels = batches.get(step)
        if pipeline is not None:
            with amp:
                loss = pipeline.train_step(inputs, labels)
        else:
            with amp:
                logits = model(inputs)
            loss = loss_fn(logits, labels)
            del logits
            loss.backward()
        if pipeline is not None:
            grad_norm = clip_across_stages(params, MAX_GRAD_NORM, pipeline.group)
        elif clip_fused:
            grad_norm = clip_in_optimizer(optimizer, params, MAX_GRAD_NORM)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()  # DTensor (sharded grads): the reduced total norm
        state.lrs.append(float(scheduler.get_last_lr()[0]))  # LambdaLR's rates are floats
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if precompute:
            precompute_fp8_scales(model)  # one fused amax for all fp8 weights, for the next all-gather
        device_log.add(loss, grad_norm)  # stays on the device: no CPU-GPU sync point here
        timer.mark()
        profiler.end(step)
        if eval_batches is not None and eval_due(step, spec):
            eval_losses.append(evaluate(pipeline or model, eval_batches, spec.eval_batches, amp, loss_fn))
            eval_steps.append(step)
            eval_intervals.add(step + len(eval_intervals) + 1)  # the interval after this step's
            timer.mark()
        failures.maybe_inject(fault, step)
        if (step + 1) % log_every == 0 or step == spec.steps - 1:
            # loss.item(): CPU-GPU sync point, every log_every steps only (this rank's loss).
            if pipeline is None or pipeline.last:
                log.info("step %d/%d loss %.4f lr %.2e", step + 1, spec.steps, loss.item(), state.lrs[-1])
            else:  # an earlier pipeline stage computes no loss
                log.info(
                    "step %d/%d (stage %d of %d) lr %.2e",
                    step + 1,
                    spec.steps,
                    pipeline.index + 1,
                    pipeline.stages,
                    state.lrs[-1],
                )

    breakdown = profiler.finish()  # collective: each rank's trace -> breakdown, gathered
    step_ms = [ms for i, ms in enumerate(timer.step_ms()) if i not in eval_intervals]
    losses, norms = device_log.read(reduce=True, holders=holders)
    eval_values = read_eval_losses(eval_losses, holders)
    eval_tokens = spec.eval_batches * spec.local_batch_size * spec.seq_len * spec.degrees.dp_degree
    eval_curve = [
        EvalPoint(step=s, loss=v if math.isfinite(v) else None, num_tokens=eval_tokens)
        for s, v in zip(eval_steps, eval_values)
    ]
    bf16_peak, own_peak, mfu_note = peaks_for(info, spec.precision)
    unprofiled_ms = step_ms[: profiler.first]  # profiled steps (the last ones) are slower: not in the figures
    summary = summarize(
        unprofiled_ms,
        warmup_steps=spec.warmup_steps,
        tokens_per_step=spec.tokens_per_step,
        num_devices=spec.num_devices,
        flops_per_token=shape.flops_per_token(spec.seq_len),
        bf16_peak=bf16_peak,
        own_peak=own_peak,
        mfu_note=mfu_note,
        memory=peak_memory_gib(device),
        num_float8_linears=facts["num_float8_linears"],
    )
    steps = step_records(step_ms, losses, norms, state.lrs, spec.tokens_per_step, spec.warmup_steps)
    state.result = RunResult(
        run_key=spec.run_key(),
        status="succeeded",
        steps=steps,
        summary=summary,
        numerics=Numerics(final_loss=losses[-1], loss_curve=losses, eval_curve=eval_curve, data=data_description(spec)),
        environment=state.environment,
        breakdown=breakdown,
    )
    log.info(
        "done: %.0f tokens/s, %.1f ms/step median, mfu %s",
        summary.tokens_per_sec,
        summary.step_ms_median,
        f"{summary.mfu_vs_bf16_peak:.3f}" if summary.mfu_vs_bf16_peak is not None else "n/a",
    )
    if is_fp8(spec.precision):
        log.info("float8 dtypes used: %s", ", ".join(fp8_dtypes))
