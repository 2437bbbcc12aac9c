"""Where an fp8 training step's GPU time goes, by kernel category, for bf16 and the fp8 recipes.

Runs our runner (runner.train.run, world size 1) under torch.profiler for the 8b shape at a small depth and
sums CUDA kernel time per category over the profiled steps (after warm-up and compilation):
bf16 GEMMs, fp8 GEMMs, attention, fused Triton kernels (norms, RoPE, SwiGLU and, for fp8, the amax/scale/cast
work), optimizer, communication, other. The difference between recipes says where fp8's speed is won or lost.

    python3 bench/profile_fp8.py [--layers 4] [--seq-len 8192] [--out DIR]      # on the GPU
    python bench/profile_fp8.py --smoke                                         # CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.contracts.specs import RunSpec, resolve_layout  # noqa: E402

CATEGORIES = (
    "gemm bf16",
    "gemm fp8",
    "attention",
    "triton fused (norm/rope/swiglu/casts)",
    "optimizer",
    "communication",
    "other",
)
WAIT_STEPS, WARMUP_STEPS, ACTIVE_STEPS = 3, 1, 3  # profiler schedule, counted in optimizer steps


def is_annotation(name: str) -> bool:
    """Ranges recorded on the GPU timeline (ProfilerStep#3, Optimizer.step#AdamW.step): they span kernels
    that are counted on their own, so adding them would count that time twice."""
    return name.startswith("ProfilerStep") or "#" in name


def category(kernel: str) -> str:
    k = kernel.lower()
    if "nccl" in k:
        return "communication"
    if any(s in k for s in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(s in k for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul")):
        # cuBLASLt's Hopper kernels for float8 inputs are named nvjet_sm90_q...; others name the dtype
        fp8 = k.startswith("nvjet_sm90_q") or any(s in k for s in ("e4m3", "e5m2", "f8f8", "fp8"))
        return "gemm fp8" if fp8 else "gemm bf16"
    if any(s in k for s in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if k.startswith("triton") or "triton_" in k:
        return "triton fused (norm/rope/swiglu/casts)"
    return "other"


def spec_for(precision: str, layers: int, seq_len: int, device_type: str, model: str) -> RunSpec:
    steps = WAIT_STEPS + WARMUP_STEPS + ACTIVE_STEPS + 1
    return RunSpec(
        model=model,
        num_layers=layers,
        precision=precision,
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=seq_len,
        local_batch_size=1,
        steps=steps,
        warmup_steps=2,
        compile=device_type == "cuda",
        device_type=device_type,
    )


def profile_run(spec: RunSpec) -> tuple[dict[str, float], float | None, list[dict]]:
    """GPU (or CPU) time per category in ms per step over the active steps, the runner's median step ms, and
    the top kernels (name, calls, ms per step, category) so the categories can be checked."""
    from runner.train import run

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.device_type == "cuda" else [])
    sched = schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1)
    with profile(activities=activities, schedule=sched) as prof:
        # one profiler step per optimizer step: the hook is global, so no change to the train loop
        handle = register_optimizer_step_post_hook(lambda *_: prof.step())
        try:
            result = run(spec)
        finally:
            handle.remove()
    if result.status != "succeeded":
        raise RuntimeError(f"{spec.precision}: {result.error}")
    totals: dict[str, float] = defaultdict(float)
    kernels: list[dict] = []
    for evt in prof.key_averages():
        if spec.device_type == "cuda":
            us = evt.self_device_time_total
            if us <= 0 or evt.device_type != torch.autograd.DeviceType.CUDA or is_annotation(evt.key):
                continue
        else:
            us = evt.self_cpu_time_total
        totals[category(evt.key)] += us / 1000 / ACTIVE_STEPS
        kernels.append(
            {
                "name": evt.key[:160],
                "calls": evt.count,
                "ms_per_step": us / 1000 / ACTIVE_STEPS,
                "category": category(evt.key),
            }
        )
    kernels.sort(key=lambda k: -k["ms_per_step"])
    return dict(totals), result.summary.step_ms_median if result.summary else None, kernels[:40]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--precisions", default="bf16,fp8-tensorwise,fp8-rowwise,fp8-rowwise-gw-hp")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, debug shape: checks the script, not the GPU")
    args = ap.parse_args()
    device_type, model = ("cpu", "debug") if args.smoke else ("cuda", "8b")
    seq_len = 64 if args.smoke else args.seq_len
    rows = {}
    for precision in args.precisions.split(","):
        t0 = time.monotonic()
        totals, step_ms, kernels = profile_run(spec_for(precision, args.layers, seq_len, device_type, model))
        rows[precision] = {
            "ms_per_step": totals,
            "step_ms_median": step_ms,
            "wall_s": time.monotonic() - t0,
            "top_kernels": kernels,
        }
        print(f"{precision}: done in {rows[precision]['wall_s']:.0f} s", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_fp8.json").write_text(json.dumps(rows, indent=1))
    names = list(rows)
    for n in names:
        print(f"\n{n}: top kernels (calls over {ACTIVE_STEPS} steps, ms per step, category)")
        for k in rows[n]["top_kernels"][:12]:
            print(f"  {k['ms_per_step']:8.2f} {k['calls']:6d}  {k['category']:<14.14} {k['name'][:90]}")
    print(
        f"\n{model} x{args.layers} layers, {seq_len} tokens, {device_type}; "
        f"{'GPU kernel' if device_type == 'cuda' else 'CPU op'} ms per step by category"
    )
    print(f"{'category':<40}" + "".join(f"{n:>20}" for n in names))
    for cat in CATEGORIES:
        print(f"{cat:<40}" + "".join(f"{rows[n]['ms_per_step'].get(cat, 0.0):>20.1f}" for n in names))
    print(f"{'sum of kernels':<40}" + "".join(f"{sum(rows[n]['ms_per_step'].values()):>20.1f}" for n in names))
    print(f"{'runner step ms (median)':<40}" + "".join(f"{rows[n]['step_ms_median'] or 0:>20.1f}" for n in names))


if __name__ == "__main__":
    main()
