"""What the plan picks per N once it weighs pipeline and context parallelism, and its time (CPU only).

    .venv/bin/python bench/plan_layouts.py [--max-gpus 8192]

Two published 8-GPU measurements of Llama 3.1 8B from bench/published, each as the one measured point of an
experiment: torchtitan's H100 FSDP table (compile, bf16: 6,667 tokens/s per GPU, local batch 2, sequence 8,192,
full activation checkpointing, on the H100 HGX platform with a 400G InfiniBand NIC per GPU) and AMD's MI325X
Primus row (FP8 data parallel: 16,224 tokens/s per GPU, 16 sequences per GPU, no recompute, MI325X platform with a
400G Pollara NIC per GPU, the measured layout taken as fsdp here). The plan projects the measured layout and, by
default, pp=2, pp=4, pp=8 and cp=2 over it (core.projection.plan.default_plan_layouts), each at the measured
global batch, and picks the fastest per N. The table prints E(N) of every layout and the best one; these are the
model's answers with the shipped constants, not measurements beyond 8 GPUs.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.analysis.scaling import RunPoint, build_report
from core.projection.model import NetworkUsed, project_report
from core.projection.network import Network
from core.projection.plan import build_plan, default_plan_layouts, plan_counts

REPEATS = 20  # timing: the projection and the plan of one case, as GET /plan computes them after its reads
CASES = [
    # name, platform, nic, precision, tokens/s per GPU at 8, spec
    (
        "8B bf16, H100 HGX + 400G IB (torchtitan, compile)",
        "h100-hgx",
        "ib-400g",
        "bf16",
        6667.0,
        {"seq_len": 8192, "local_batch_size": 2, "activation_checkpointing": "full", "compile": True},
    ),
    (
        "8B fp8, MI325X + 400G Pollara (AMD Primus row)",
        "mi325x-platform",
        "pollara-400g",
        "fp8-tensorwise",
        16224.0,
        {"seq_len": 8192, "local_batch_size": 16, "activation_checkpointing": "none"},
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-gpus", type=int, default=8192)
    args = ap.parse_args()
    ids = itertools.count()
    for name, platform, nic, precision, x8, spec in CASES:
        net = Network(platform=platform, nic=nic)
        used = NetworkUsed(
            cluster=platform,
            source="bench/plan_layouts.py",
            gpus_per_node=8,
            max_devices=None,
            inter_node_gb_per_s=net.inter_node_gb_per_s,
            network=net,
        )
        point = RunPoint(
            run_id=next(ids),
            model="8b",
            num_layers=32,
            precision=precision,
            layout="fsdp",
            scaling="weak",
            cluster=platform,
            num_devices=8,
            status="succeeded",
            tokens_per_sec=x8 * 8,
        )
        report = build_report([point])
        layouts = default_plan_layouts(["fsdp"])
        counts = plan_counts([8], args.max_gpus)
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            projected = project_report(report, spec, used, counts, layouts=layouts)
            plan = build_plan(report, projected, tokens=1e12, max_gpus=args.max_gpus)
        ms = (time.perf_counter() - t0) / REPEATS * 1e3
        forms = ["fsdp", *layouts]
        print(
            f"\n{name}: E(N) per layout, the plan's best ({len(projected.series)} series x {len(counts)} counts "
            f"projected and planned in {ms:.1f} ms, mean of {REPEATS})"
        )
        print("| N | " + " | ".join(forms) + " | best |")
        print("| --- " * (len(forms) + 2) + "|")
        for row in plan.rows:
            eff = {o.layout: o.efficiency for o in row.options}
            cells = [f"{100 * eff[f]:.1f}%" if f in eff else "-" for f in forms]
            best = row.best.layout if row.best else "-"
            print(f"| {row.num_devices} | " + " | ".join(cells) + f" | {best} |")


if __name__ == "__main__":
    main()
