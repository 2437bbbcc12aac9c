"""The runner's pipeline against the bubble the projection charges for it, on the CPU (gloo, one thread a rank).

    .venv/bin/python bench/pipeline_bubble_cpu.py [--layers 8] [--seq-len 256] [--micro-batches 2 4 8 16]

For each m (micro-batches of one sequence a step): the debug shape with --layers blocks in fp32, trained by one
process (layout fsdp, N = 1, m sequences a step) and by two pipeline stages (layout pp=2+fsdp, N = 2, the same m
sequences as m micro-batches of a 1F1B schedule), each under `torch.distributed.run` as the service launches it.
The measured ratio is the pipelined step's median over the one process's. The modelled ratio is what
core.projection.step_model charges: the slowest stage's share of the step's FLOPs (the runner's split,
ModelShape.pipeline_split; Workload.stage_compute_factor / P) times the 1F1B bubble 1 + (P - 1) / m
(Workload.bubble); the stage-to-stage sends (a (1, seq, dim) activation through gloo) are left out of it. Prints
one table and a least-squares line of the pipelined step over its m + 1 micro-batch slots.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from core.contracts.specs import RunResult, RunSpec, resolve_layout  # noqa: E402
from core.projection.step_model import Workload  # noqa: E402

STEPS, WARMUP = 14, 4


def timed(layout: str, n: int, m: int, args) -> float:
    """Median step time (ms) of one run under torch.distributed.run, n ranks of one thread each."""
    spec = RunSpec(
        model="debug",
        num_layers=args.layers,
        precision="fp32",
        layout=layout,
        degrees=resolve_layout(layout, n),
        scaling="weak",
        seq_len=args.seq_len,
        local_batch_size=m,
        steps=STEPS,
        warmup_steps=WARMUP,
        seed=0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(spec.model_dump_json())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
        cmd += ["-m", "runner", "--spec", str(spec_path), "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        result = RunResult.model_validate_json(out.read_text()) if out.exists() else None
    if proc.returncode != 0 or result is None or result.summary is None:
        raise SystemExit(f"{layout} at N={n} failed: {result.error if result else proc.stderr[-3000:]}")
    return result.summary.step_ms_median


def modelled(m: int, args) -> tuple[float, float]:
    """(slowest stage's FLOP share, bubble) of pp=2 at N = 2 with m one-sequence micro-batches."""
    w = Workload(
        model="debug", num_layers=args.layers, precision="fp32", layout="pp=2+fsdp", seq_len=args.seq_len,
        local_batch_size=m,
    )  # fmt: skip
    return w.stage_compute_factor(2) / 2, w.bubble(2)


def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys on xs."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8, 16])
    args = ap.parse_args()
    started = time.perf_counter()
    ms = args.micro_batches
    one = [timed("fsdp", 1, m, args) for m in ms]
    pp = [timed("pp=2+fsdp", 2, m, args) for m in ms]
    # 1F1B: a stage works m + P - 1 micro-batch slots a step (m of its own, P - 1 waiting in fill and drain)
    slot, fixed = line([m + 1.0 for m in ms], pp)
    per_seq, one_fixed = line([float(m) for m in ms], one)
    print(
        f"debug shape x{args.layers} blocks, seq {args.seq_len}, fp32, {STEPS} steps ({WARMUP} warm-up), "
        f"one thread a rank; torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; {time.perf_counter() - started:.0f} s"
    )
    print(
        "| m | one process, ms | pp=2 (2 ranks), ms | measured ratio | modelled ratio (FLOP share x bubble) "
        "| pp=2 on the 1F1B line, ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for m, t1, tp in zip(ms, one, pp):
        share, bubble = modelled(m, args)
        print(f"| {m} | {t1:.1f} | {tp:.1f} | {tp / t1:.3f} | {share:.3f} x {bubble:.3f} = {share * bubble:.3f} "
              f"| {fixed + slot * (m + 1):.1f} |")  # fmt: skip
    share, _ = modelled(ms[0], args)
    worst = max(abs(tp - (fixed + slot * (m + 1))) / tp for m, tp in zip(ms, pp))
    print(
        f"1F1B line: pp=2 step = {fixed:.1f} ms + {slot:.1f} ms x (m + 1) slots, worst residual {worst:.1%}; "
        f"one process: {one_fixed:.1f} ms + {per_seq:.1f} ms x m. A slot costs {slot / per_seq:.3f} of the one "
        f"process's time per sequence (the slowest stage's FLOP share: {share:.3f})."
    )


if __name__ == "__main__":
    main()
