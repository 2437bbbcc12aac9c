"""The scaling report of an experiment as the CLI and the demo print it (rich tables).

The report comes from GET /experiments/{id}/scaling when the server has it, else it is computed here
with core.scaling from the runs' summaries (GET /runs/{id}): the same function, the same numbers.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from api.cli_client import ApiClient
from core.scaling import RunPoint, ScalingReport, build_report


def run_point(detail: dict[str, Any]) -> RunPoint:
    spec, summary = detail.get("spec") or {}, detail.get("summary") or {}
    numerics = (detail.get("result") or {}).get("numerics") or {}
    return RunPoint(run_id=detail["id"], model=spec.get("model", "?"), num_layers=spec.get("num_layers", 0),
                    precision=detail["precision"], layout=detail["layout"], scaling=spec.get("scaling", "weak"),
                    cluster=detail["cluster"], num_devices=detail["num_devices"], status=detail["status"],
                    tokens_per_sec=summary.get("tokens_per_sec"), step_ms_median=summary.get("step_ms_median"),
                    mfu_vs_bf16_peak=summary.get("mfu_vs_bf16_peak"),
                    mfu_vs_precision_peak=summary.get("mfu_vs_precision_peak"),
                    peak_memory_allocated_gib=summary.get("peak_memory_allocated_gib"),
                    final_loss=numerics.get("final_loss"), imported=bool(detail.get("imported")))


def fetch_report(client: ApiClient, experiment_id: int, details: list[dict[str, Any]] | None = None
                 ) -> tuple[ScalingReport, list[dict[str, Any]]]:
    """(report, run details). Run details are fetched once and reused by the caller's runs table."""
    if details is None:
        details = [client.get(f"/runs/{r['id']}") for r in client.all_runs(experiment_id)]
    served = client.get_optional(f"/experiments/{experiment_id}/scaling")
    if isinstance(served, dict) and "series" in served:
        try:
            return ScalingReport.model_validate(served), details
        except ValueError:
            pass  # another shape: compute it here
    return build_report(run_point(d) for d in details), details


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def runs_table(details: list[dict[str, Any]]) -> Table:
    table = Table(title="Runs", title_justify="left")
    for col in ("run", "precision", "layout", "N", "status", "tok/s/dev", "step ms", "final loss", "error"):
        table.add_column(col, justify="right" if col in ("run", "N", "tok/s/dev", "step ms", "final loss") else "left")
    for d in sorted(details, key=lambda d: (d["precision"], d["layout"], d["num_devices"], d["id"])):
        summary = d.get("summary") or {}
        numerics = (d.get("result") or {}).get("numerics") or {}
        error = d.get("error") or {}
        table.add_row(str(d["id"]), d["precision"], d["layout"], str(d["num_devices"]), d["status"],
                      _num(summary.get("tokens_per_sec_per_device"), ",.0f"), _num(summary.get("step_ms_median"), ".1f"),
                      _num(numerics.get("final_loss"), ".3f"), error.get("kind") or "")
    return table


def scaling_table(report: ScalingReport) -> Table:
    table = Table(title="Scaling", title_justify="left",
                  caption="X = global tokens/s (median over repeats); E(N) = X(N) / (X(N0) * N / N0), N0 = smallest N",
                  caption_justify="left")
    for col in ("precision", "layout", "N", "X tok/s", "tok/s/dev", "E(N)", "MFU", "status"):
        table.add_column(col, justify="left" if col in ("precision", "layout", "status") else "right")
    for s in report.series:
        for p in s.points:
            mfu = _num(p.mfu_vs_bf16_peak, ".1%") if p.mfu_vs_bf16_peak is not None else "n/a"
            status = p.status + (f" ({', '.join(p.flags)})" if p.flags else "")
            table.add_row(s.key.precision, s.key.layout, str(p.num_devices), _num(p.tokens_per_sec, ",.0f"),
                          _num(p.tokens_per_sec_per_device, ",.0f"), _num(p.efficiency, ".1%"), mfu, status)
    return table


def speedup_table(report: ScalingReport) -> Table:
    table = Table(title="fp8 speedup S(N) = X_fp8(N) / X_bf16(N)", title_justify="left",
                  caption="loss gap = (fp8 - bf16) / bf16 final loss", caption_justify="left")
    for col in ("fp8 recipe", "layout", "N", "fp8 tok/s", "bf16 tok/s", "speedup", "loss gap"):
        table.add_column(col, justify="left" if col in ("fp8 recipe", "layout") else "right")
    for sp in report.speedups:
        table.add_row(sp.precision, sp.layout, str(sp.num_devices), f"{sp.fp8_tokens_per_sec:,.0f}",
                      f"{sp.bf16_tokens_per_sec:,.0f}", f"{sp.speedup:.2f}x", _num(sp.loss_rel_gap, "+.1%"))
    return table


def print_report(console: Console, report: ScalingReport, details: list[dict[str, Any]] | None = None) -> None:
    if details:
        console.print(runs_table(details))
    console.print(scaling_table(report))
    if report.speedups:
        console.print(speedup_table(report))
    notes = [f"{s.key.precision}/{s.key.layout}: {n}" for s in report.series for n in s.notes]
    mfu_notes = {(d.get("summary") or {}).get("mfu_note") for d in details or []} - {None}
    for note in notes + sorted(mfu_notes):
        console.print(f"note: {note}")
