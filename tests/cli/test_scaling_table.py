"""`scalebench show`'s scaling table, without a server: a point's status is said once, its other flags beside it."""

from __future__ import annotations

from cli.report import scaling_table
from cli.runs import console
from core.analysis.scaling import RunPoint, build_report


def _run(run_id: int, n: int, status: str, tokens_per_sec: float | None = None) -> RunPoint:
    return RunPoint(run_id, "debug", 2, "bf16", "fsdp", "weak", "local-cpu", n, status, tokens_per_sec=tokens_per_sec)


def _rows() -> list[str]:
    runs = [_run(1, 1, "succeeded", 500.0), _run(2, 2, "queued"), _run(3, 4, "failed"), _run(4, 4, "succeeded", 900.0)]
    runs.append(_run(5, 8, "failed"))
    with console.capture() as captured:
        console.print(scaling_table(build_report(runs)), width=200)
    return [line for line in captured.get().splitlines() if "│ bf16" in line]


def test_status_said_once() -> None:
    rows = _rows()
    assert len(rows) == 4
    assert "measured" in rows[0]
    assert "pending" in rows[1] and "pending (pending)" not in rows[1]
    # a repeat that failed beside one that succeeded: measured, with the flag beside it
    assert "measured (some_failed)" in rows[2]
    assert "failed" in rows[3] and "failed (failed)" not in rows[3]
