"""Prints the sbatch command and job script the Slurm launcher would submit, without submitting anything.

    .venv/bin/python scripts/slurm/render_job.py --clusters scripts/slurm/clusters.example.toml \
        --cluster h200-pod --gpus 16 --precision fp8-rowwise --env NCCL_NVLS_ENABLE=0

docs/slurm.md shows its output; run it against your own clusters.toml to check a config before a worker uses it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.contracts.clusters import load_clusters  # noqa: E402
from core.contracts.matrix import expand  # noqa: E402
from core.contracts.specs import ExperimentSpec  # noqa: E402
from worker.launchers import slurm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", required=True, help="clusters TOML file")
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--model", default="8b")
    ap.add_argument("--precision", default="fp8-rowwise")
    ap.add_argument("--layout", default="fsdp")
    ap.add_argument("--run-id", default="1234")
    ap.add_argument("--code-dir", default=None, help="scalebench checkout the nodes see (default: this one)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE of the worker's environment")
    args = ap.parse_args(argv)
    cluster = load_clusters(args.clusters)[args.cluster]
    exp = ExperimentSpec(
        name="example",
        model=args.model,
        cluster=cluster.name,
        gpu_counts=[args.gpus],
        precisions=[args.precision],
        layouts=[args.layout],
        seq_len=8192,
        steps=30,
        warmup_steps=5,
    )
    runs, skipped = expand(exp, cluster)
    if not runs:
        raise SystemExit(f"no run: {skipped}")
    opts = cluster.slurm or slurm.SlurmOptions()
    run_dir = Path(opts.shared_dir or ".scalebench/runs") / args.run_id
    env = slurm.passthrough_env(dict(kv.split("=", 1) for kv in args.env))
    python = opts.python or sys.executable
    code_dir = Path(args.code_dir) if args.code_dir else slurm.REPO_ROOT
    sbatch = ["sbatch", *slurm.sbatch_args(cluster, runs[0], args.run_id, run_dir), str(run_dir / slurm.SCRIPT_FILE)]
    print(f"$ {shlex.join(sbatch)}\n")
    print(f"$ cat {run_dir / slurm.SCRIPT_FILE}")
    print(
        slurm.render_script(cluster, runs[0], args.run_id, run_dir, python=python, env=env, code_dir=code_dir), end=""
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
