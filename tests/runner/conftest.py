"""Helpers for runner tests: tiny debug-shape specs and real torchrun launches (gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from core.contracts.specs import RunResult, RunSpec, resolve_layout

REPO = Path(__file__).resolve().parents[2]


def make_spec(precision: str = "fp32", layout: str = "fsdp", num_devices: int = 1, **overrides) -> RunSpec:
    """Debug shape, 2 layers, 4 x 32 tokens per DP rank: a step takes tens of ms on one core."""
    kw = dict(
        model="debug",
        num_layers=2,
        precision=precision,
        layout=layout,
        degrees=resolve_layout(layout, num_devices),
        scaling="weak",
        seq_len=32,
        local_batch_size=4,
        steps=12,
        warmup_steps=2,
        lr=3e-3,
        lr_warmup_steps=2,
        seed=7,
    )
    kw.update(overrides)
    return RunSpec(**kw)


def launch(
    spec: RunSpec, tmp_path: Path, nproc: int | None = None, env: dict | None = None, timeout_s: float = 180
) -> tuple[int, RunResult | None, str]:
    """Run `python -m runner` (nproc None: one process without torchrun; else torchrun --nproc-per-node)."""
    spec_path, out = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(spec.model_dump_json())
    base = [sys.executable, "-m", "runner", "--spec", str(spec_path), "--out", str(out)]
    if nproc is not None:
        base = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            *base[1:],
        ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(base, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout_s)
    result = RunResult.model_validate_json(out.read_text()) if out.exists() else None
    return proc.returncode, result, proc.stderr


def losses(result: RunResult) -> list[float]:
    assert result.numerics is not None
    return result.numerics.loss_curve


def dump(result: RunResult | None, stderr: str) -> str:
    """Assertion message: the error and the log tail."""
    err = json.dumps(result.error.model_dump(), indent=1)[:3000] if result and result.error else "no result"
    return f"{err}\n--- stderr tail ---\n{stderr[-3000:]}"
