"""The Summary arithmetic of docs/architecture.md, one home for every engine (pure: no torch).

Definitions: tokens/s per device = global tokens per step / step time / N; TFLOP/s per device = FLOPs/token *
that; MFU = TFLOP/s per device / peak dense TFLOP/s (bf16 peak, and the precision's own). Step times come from
the engine: our runner's and TorchTitan's optimizer-step hook, or a command engine's own log.
"""

from __future__ import annotations

import statistics

from core.contracts.specs import StepRecord, Summary


def step_records(
    step_ms: list[float],
    losses: list[float],
    grad_norms: list[float],
    lrs: list[float],
    tokens_per_step: int,
    warmup_steps: int,
) -> list[StepRecord]:
    n = max(len(step_ms), len(losses))

    def pick(xs: list[float], i: int) -> float | None:
        return xs[i] if i < len(xs) else None

    return [
        StepRecord(
            step=i,
            loss=pick(losses, i),
            step_ms=pick(step_ms, i),
            tokens=tokens_per_step,
            grad_norm=pick(grad_norms, i),
            lr=pick(lrs, i),
            warmup=i < warmup_steps,
        )
        for i in range(n)
    ]


def summarize(
    step_ms: list[float],
    *,
    warmup_steps: int,
    tokens_per_step: int,
    num_devices: int,
    flops_per_token: int,
    bf16_peak: float | None,
    own_peak: float | None,
    mfu_note: str | None,
    memory: tuple[float | None, float | None],
    num_float8_linears: int | None,
    step_time_source: str | None = "optimizer-step hook",
) -> Summary:
    """Throughput and MFU over the timed (post-warm-up) steps."""
    timed = step_ms[warmup_steps:]
    if not timed:
        raise ValueError(f"no timed steps: {len(step_ms)} steps measured, warmup_steps({warmup_steps})")
    median_ms = statistics.median(timed)
    tokens_per_sec = tokens_per_step / (median_ms / 1000.0)
    per_device = tokens_per_sec / num_devices
    tflops = flops_per_token * per_device / 1e12
    return Summary(
        num_timed_steps=len(timed),
        tokens_per_step=tokens_per_step,
        tokens_per_sec=tokens_per_sec,
        tokens_per_sec_per_device=per_device,
        step_ms_median=median_ms,
        step_ms_min=min(timed),
        step_ms_max=max(timed),
        flops_per_token=flops_per_token,
        tflops_per_device=tflops,
        bf16_peak_tflops=bf16_peak,
        precision_peak_tflops=own_peak,
        mfu_vs_bf16_peak=tflops / bf16_peak if bf16_peak else None,
        mfu_vs_precision_peak=tflops / own_peak if own_peak else None,
        mfu_note=mfu_note,
        peak_memory_allocated_gib=memory[0],
        peak_memory_reserved_gib=memory[1],
        num_float8_linears=num_float8_linears,
        step_time_source=step_time_source,
    )
