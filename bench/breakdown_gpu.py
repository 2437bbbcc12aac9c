"""The runner's step breakdown (profile_steps) next to bench/profile_fp8.py's kernel categories, on one shape.

For each precision, two runs of `runner.train.run` (world size 1, layout fsdp at N=1, compile on the GPU):
1. with `profile_steps`: the breakdown the service stores (core.analysis.breakdown: intervals on the device timeline,
   categories by kernel name and launching op), ms per profiled step;
2. bench/profile_fp8.py's `profile_run`: CUDA kernel time summed per category over its active steps.
Then one table: every breakdown category beside profile_fp8's, and the like-for-like pairs with their ratio.

    python3 bench/breakdown_gpu.py [--layers 16] [--seq-len 8192] [--out DIR]     # one H200: 8b x16, compile
    python bench/breakdown_gpu.py --smoke                                         # CPU, debug shape: the script

Pairs (breakdown / profile_fp8): GEMM bf16, GEMM fp8, attention, optimizer, communication, and "fp8 cast +
elementwise" / "triton fused + other" (every other kernel on both sides: a compiler-fused kernel that holds a
float8 amax/scale/cast counts as cast in the breakdown, so the split between the two differs by definition).
Also fp8 cast / (triton fused - bf16's triton fused): profile_fp8's reading of the cast cost (its results note),
an estimate that leaves in the cast kernels the norm/SwiGLU work fused into them.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.profile_fp8 import ACTIVE_STEPS, profile_run, spec_for
from core.analysis.breakdown import CATEGORY_KEYS, StepBreakdown
from core.contracts.specs import RunSpec, resolve_layout

TRITON = "triton fused (norm/rope/swiglu/casts)"
PAIRS = (  # (label, breakdown keys summed, profile_fp8 categories summed)
    ("GEMM bf16", ("gemm_bf16_ms",), ("gemm bf16",)),
    ("GEMM fp8", ("gemm_fp8_ms",), ("gemm fp8",)),
    ("attention", ("attention_ms",), ("attention",)),
    ("optimizer", ("optimizer_ms",), ("optimizer",)),
    ("communication", ("communication_ms",), ("communication",)),
    ("fp8 cast + elementwise | triton fused + other", ("fp8_cast_ms", "elementwise_ms"), (TRITON, "other")),
)


def breakdown_spec(
    precision: str, layers: int, seq_len: int, device_type: str, model: str, profile_steps: int
) -> RunSpec:
    """Warm-up covers compilation; a few timed steps; then the profiled steps (the run's last)."""
    warmup, timed = (4, 3) if device_type == "cuda" else (1, 1)
    return RunSpec(
        model=model,
        num_layers=layers,
        precision=precision,
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=seq_len,
        local_batch_size=1,
        steps=warmup + timed + profile_steps,
        warmup_steps=warmup,
        profile_steps=profile_steps,
        compile=device_type == "cuda",
        device_type=device_type,
    )


def breakdown_run(spec: RunSpec, trace_dir: Path) -> tuple[StepBreakdown, float | None, list[int]]:
    from runner.train import run

    trace_dir.mkdir(parents=True, exist_ok=True)
    result = run(spec, trace_dir=trace_dir)
    if result.status != "succeeded" or result.breakdown is None:
        raise RuntimeError(f"{spec.precision}: {result.error}")
    return result.breakdown.median, result.summary.step_ms_median, result.breakdown.profiled_steps


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def comparison_rows(rows: dict) -> list[tuple[str, str, list[tuple[float | None, float | None]]]]:
    """(label, kind, [(breakdown, profile_fp8) per precision]) for the table."""
    bf16_triton = rows.get("bf16", {}).get("profile_fp8", {}).get(TRITON)
    out = []
    for label, mine, theirs in PAIRS:
        out.append(
            (
                label,
                "pair",
                [
                    (sum(r["breakdown"][k] for k in mine), sum(r["profile_fp8"].get(c, 0.0) for c in theirs))
                    for r in rows.values()
                ],
            )
        )
    if bf16_triton is not None:
        out.append(
            (
                "fp8 cast | triton fused - bf16's",
                "estimate",
                [
                    (r["breakdown"]["fp8_cast_ms"], r["profile_fp8"].get(TRITON, 0.0) - bf16_triton)
                    if p != "bf16"
                    else (None, None)
                    for p, r in rows.items()
                ],
            )
        )
    return out


def print_table(rows: dict, title: str) -> None:
    names = list(rows)
    print(f"\n{title}")
    print("breakdown (ms per profiled step, core.analysis.breakdown; the first eight add up to step_ms)")
    print(f"{'category':<34}" + "".join(f"{n:>22}" for n in names))
    for key in (
        "gemm_bf16_ms",
        "gemm_fp8_ms",
        "fp8_cast_ms",
        "attention_ms",
        "elementwise_ms",
        "optimizer_ms",
        "exposed_communication_ms",
        "idle_ms",
        "step_ms",
        "communication_ms",
        "overlapped_communication_ms",
    ):
        print(f"{key:<34}" + "".join(f"{rows[n]['breakdown'][key]:>22.2f}" for n in names))
    print(
        f"{'runner step ms (unprofiled median)':<34}"
        + "".join(f"{rows[n]['step_ms_median'] or 0:>22.2f}" for n in names)
    )
    print(f"\nprofile_fp8 (kernel ms per step, summed over its {ACTIVE_STEPS} active steps)")
    cats = sorted({c for r in rows.values() for c in r["profile_fp8"]})
    for c in cats:
        print(f"{c[:34]:<34}" + "".join(f"{rows[n]['profile_fp8'].get(c, 0.0):>22.2f}" for n in names))
    print(f"{'sum of kernels':<34}" + "".join(f"{sum(rows[n]['profile_fp8'].values()):>22.2f}" for n in names))
    print("\nbreakdown | profile_fp8 (ratio)")
    for label, kind, values in comparison_rows(rows):
        cells = []
        for mine, theirs in values:
            if mine is None:
                cells.append(f"{'-':>34}")
                continue
            ratio = f"{mine / theirs:.3f}" if theirs else "n/a"
            cells.append(f"{mine:>10.2f} |{theirs:>9.2f} ({ratio})".rjust(34))
        print(
            f"{label[:46]:<46}" + "".join(cells) + ("   <- estimate, not like for like" if kind == "estimate" else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--precisions", default="bf16,fp8-tensorwise,fp8-rowwise")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("breakdown-gpu-out"))
    ap.add_argument("--smoke", action="store_true", help="CPU, debug shape, 2 layers: checks the script")
    args = ap.parse_args()
    device_type, model = ("cpu", "debug") if args.smoke else ("cuda", "8b")
    layers, seq_len = (2, 64) if args.smoke else (args.layers, args.seq_len)
    if device_type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke on CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    for precision in args.precisions.split(","):
        t0 = time.monotonic()
        spec = breakdown_spec(precision, layers, seq_len, device_type, model, args.profile_steps)
        b, step_ms, profiled = breakdown_run(spec, args.out / precision)
        release()
        t1 = time.monotonic()
        totals, ref_step_ms, kernels = profile_run(spec_for(precision, layers, seq_len, device_type, model))
        release()
        rows[precision] = {
            "breakdown": b.model_dump(),
            "step_ms_median": step_ms,
            "profiled_steps": profiled,
            "profile_fp8": totals,
            "profile_fp8_step_ms_median": ref_step_ms,
            "profile_fp8_top_kernels": kernels,
            "breakdown_s": t1 - t0,
            "profile_fp8_s": time.monotonic() - t1,
        }
        print(f"{precision}: breakdown run {t1 - t0:.0f} s, profile_fp8 run {time.monotonic() - t1:.0f} s", flush=True)
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if device_type == "cuda" else platform.processor() or "cpu",
        "model": model,
        "layers": layers,
        "seq_len": seq_len,
        "profile_steps": args.profile_steps,
        "categories": list(CATEGORY_KEYS),
    }
    (args.out / "breakdown_gpu.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print_table(
        rows,
        f"{model} x{layers} layers, 1 x {seq_len} tokens, {device_type}, compile="
        f"{device_type == 'cuda'}; torch {torch.__version__}",
    )


if __name__ == "__main__":
    main()
