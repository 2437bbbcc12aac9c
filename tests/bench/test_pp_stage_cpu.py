"""bench/pp_stage_gpu.py on the CPU (its --model debug smoke path): the script a GPU call runs must not break where
no GPU can catch it. Its figures here are CPU timings and are not checked; its tables and splits are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.catalog.shapes import get_shape

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--model", "debug", "--layers", "4", "--seq-len", "64", "--repeats", "1"]


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "pp_stage_gpu.py"), *SMALL, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _rows(out: str, split: str) -> dict[int, str]:
    """{P: blocks per stage} of the table rows of one split."""
    return {int(m[1]): m[2] for m in re.finditer(rf"^\| (\d+) \| {split} \| ([\d/]+) \|", out, re.MULTILINE)}


def test_eager_stages_of_two_precisions_follow_the_runners_split() -> None:
    out = _run("--pps", "2", "4", "--precisions", "bf16", "fp8-tensorwise")
    shape = get_shape("debug", 4)
    for precision in ("bf16", "fp8-tensorwise"):
        table = out.split(f"\n{precision}\n", 1)[1].split("\n\n", 1)[0]
        assert _rows(table, "even") == {2: "2/2", 4: "1/1/1/1"}
        assert _rows(table, "weighted") == {p: "/".join(map(str, shape.pipeline_split(p, 64))) for p in (2, 4)}, table
    assert out.count("output layer + loss, measured:") == 2  # per precision, at P = 4 (P = 2 has no middle stage)


@pytest.mark.slow
def test_compiled_stages_and_loss_run() -> None:
    out = _run("--pps", "2", "--precisions", "bf16", "--compile")
    assert "compiled blocks" in out and _rows(out, "weighted") == {2: "2/2"}
