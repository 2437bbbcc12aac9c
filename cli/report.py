"""The scaling report of an experiment as the CLI and the demo print it (rich tables).

Three requests: the report as GET /experiments/{id}/scaling serves it (the numbers are the server's; nothing
is recomputed here), the experiment's runs page (GET /experiments/{id}/runs) and the projection (GET
/experiments/{id}/projection: beyond the measured range, the one prediction, E(N) with its 80% interval; the
Amdahl/USL fits describe the measured range only). `show` makes a fourth, the step breakdown of profiled runs
(GET /experiments/{id}/breakdown), printed when there is one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from cli.client import ApiClient
from core.analysis.breakdown import ExperimentBreakdown
from core.analysis.numerics import short_verdict
from core.analysis.scaling import ScalingReport
from core.analysis.time_to_loss import short_effective
from core.projection.model import INTERVAL_NOTE_PREFIX


def add_columns(table: Table, columns: Iterable[str], left: Collection[str], numbers_whole: bool = True) -> None:
    """The columns of a report table, `left` ones (text) left-aligned, the others (numbers) right-aligned. A terminal
    too narrow for the table narrows the text columns (and, with numbers_whole False, for tables with more numbers
    than a narrow terminal holds, every column), and a cell that no longer fits wraps or folds onto the next line: it
    never ends in an ellipsis, so every cell is shown whole."""
    for col in columns:
        number = col not in left
        table.add_column(col, justify="right" if number else "left", no_wrap=number and numbers_whole, overflow="fold")


def fetch_report(client: ApiClient, experiment_id: int) -> tuple[ScalingReport, list[dict[str, Any]]]:
    """(the served scaling report, the experiment's runs)."""
    report = ScalingReport.model_validate(client.get(f"/experiments/{experiment_id}/scaling"))
    return report, client.all_runs(experiment_id)


def fetch_projection(client: ApiClient, experiment_id: int) -> dict[str, Any] | str:
    """The served projection at its default device counts, or the problem that refused it on one line (e.g. a
    422: the cluster describes no network and its device is unknown)."""
    body, problem = client.get_or_problem(f"/experiments/{experiment_id}/projection")
    return body if problem is None else problem


def fetch_breakdown(client: ApiClient, experiment_id: int) -> ExperimentBreakdown:
    """The served step breakdown (series empty when no run was profiled)."""
    return ExperimentBreakdown.model_validate(client.get(f"/experiments/{experiment_id}/breakdown"))


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _engine(value: dict[str, Any] | Any) -> str:
    return (value.get("engine") if isinstance(value, dict) else getattr(value, "engine", None)) or "scalebench"


ERROR_HEAD_CHARS = 100  # of a failed run's message in the runs table (`scalebench logs RUN`: the whole)
ERROR_LAST_LINE_CHARS = 80


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_error(run: dict[str, Any]) -> str:
    """A failed run's error for a table cell: `kind: message`, the message on one line and cut short; a message
    with a log tail after it (`--- log tail ---`) keeps the tail's last line, where a failure usually says why."""
    kind = run.get("error_kind")
    if not kind:
        return ""
    head, _, tail = (run.get("error_message") or "").partition("\n--- ")
    last = next((line for line in reversed(tail.splitlines()[1:]) if line.strip()), "")
    parts = [_clip(" ".join(head.split()), ERROR_HEAD_CHARS), _clip(" ".join(last.split()), ERROR_LAST_LINE_CHARS)]
    text = " … ".join(p for p in parts if p)
    return f"{kind}: {text}" if text else kind


def runs_table(runs: list[dict[str, Any]]) -> Table:
    """One row per run; the engine and seed columns appear when the experiment has several."""
    engines = len({_engine(r) for r in runs}) > 1
    seeds = len({r.get("seed", 0) for r in runs}) > 1
    table = Table(title="Runs", title_justify="left")
    cols = (
        "run",
        *(["engine"] if engines else []),
        "precision",
        "layout",
        "N",
        *(["seed"] if seeds else []),
        "status",
        "tok/s/dev",
        "step ms",
        "error",
    )
    add_columns(table, cols, left=("engine", "precision", "layout", "status", "error"))
    for r in sorted(runs, key=lambda r: (_engine(r), r["precision"], r["layout"], r["num_devices"], r["id"])):
        table.add_row(
            str(r["id"]),
            *([_engine(r)] if engines else []),
            r["precision"],
            r["layout"],
            str(r["num_devices"]),
            *([str(r.get("seed", 0))] if seeds else []),
            r["status"],
            _num(r.get("tokens_per_sec_per_device"), ",.0f"),
            _num(r.get("step_ms_median"), ".1f"),
            run_error(r),
        )
    return table


def scaling_table(report: ScalingReport) -> Table:
    table = Table(
        title="Scaling",
        title_justify="left",
        caption="X = global tokens/s (median over repeats); E(N) = X(N) / (X(N0) * N / N0), N0 = smallest N",
        caption_justify="left",
    )
    engines = len({s.key.engine for s in report.series}) > 1
    columns = (*(["engine"] if engines else []), "precision", "layout", "N", "X tok/s", "tok/s/dev", "E(N)", "MFU")
    add_columns(table, (*columns, "status"), left=("engine", "precision", "layout", "status"))
    for s in report.series:
        for p in s.points:
            mfu = _num(p.mfu_vs_bf16_peak, ".1%") if p.mfu_vs_bf16_peak is not None else "n/a"
            flags = [f for f in p.flags if f != p.status]  # "pending", "failed" are also flags: say them once
            status = p.status + (f" ({', '.join(flags)})" if flags else "")
            table.add_row(
                *([s.key.engine] if engines else []),
                s.key.precision,
                s.key.layout,
                str(p.num_devices),
                _num(p.tokens_per_sec, ",.0f"),
                _num(p.tokens_per_sec_per_device, ",.0f"),
                _num(p.efficiency, ".1%"),
                mfu,
                status,
            )
    return table


def _beyond_measured(series: dict[str, Any]) -> list[dict[str, Any]]:
    """The projected points of a series above its largest measured N (none without a measured point)."""
    measured = [p["num_devices"] for p in series["points"] if p.get("measured_tokens_per_sec") is not None]
    if not measured:
        return []
    return [p for p in series["points"] if p["num_devices"] > max(measured)]


def _interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.1%}-{high:.1%}"


def projection_table(projection: dict[str, Any]) -> Table | None:
    """Per series, every projected N above its largest measured N: E(N), its 80% interval and tokens/s per
    device (None when no series has such a point)."""
    net = projection["network"]
    size = net.get("max_devices")
    on = f"the projection on cluster {net['cluster']}'s network ({net['source']})"
    if any((s.get("calibration") or {}).get("fitted") for s in projection["series"]):
        on += ", fitted to the measured points beyond N0 (scalebench plan --no-calibrate: from N0 alone)"
    # the stacks it charged, and the series charged the runner's for want of one
    stacks = list(projection.get("stacks", []))
    # and the layout families whose published points the interval held less often than it promises
    stacks += sorted(
        {
            n
            for s in projection["series"]
            for n in s.get("notes", [])
            if n.startswith(("measured on ", INTERVAL_NOTE_PREFIX))
        }
    )
    on += "".join(f"; {line}" for line in stacks)
    table = Table(
        title="Projected beyond the measured range",
        title_justify="left",
        caption=f"{on}; 80%: its 80% prediction interval of E(N) (from its misses on published results, wider with "
        "each doubling of N); the one prediction beyond the measured range (the Amdahl/USL fits describe the "
        "measured range only)",
        caption_justify="left",
    )
    series = [(s, _beyond_measured(s)) for s in projection["series"]]
    engines = len({_engine(s["key"]) for s, _ in series}) > 1
    columns = (*(["engine"] if engines else []), "precision", "layout", "N", "E(N)", "E(N) 80%", "tok/s/dev", "note")
    add_columns(table, columns, left=("engine", "precision", "layout", "note"))
    rows = 0
    marks: dict[str, int] = {}  # a note repeats on many rows: a mark there, its text once under the table
    for s, beyond in series:
        k = s["key"]
        for p in beyond:
            notes = [f"beyond the cluster's {size} devices"] if p.get("beyond_cluster") and size else []
            notes += [p["note"]] if p.get("note") else []
            table.add_row(
                *([_engine(k)] if engines else []),
                k["precision"],
                k["layout"],
                str(p["num_devices"]),
                _num(p.get("efficiency"), ".1%"),
                _interval(p.get("efficiency_low"), p.get("efficiency_high")),
                _num(p.get("tokens_per_sec_per_device"), ",.0f"),
                " ".join(f"†{i}" for i in sorted(marks.setdefault(n, len(marks) + 1) for n in notes)),
            )
            rows += 1
    table.caption = str(table.caption) + "".join(f"; †{i}: {n}" for n, i in marks.items())
    return table if rows else None


def engine_ratio_table(report: ScalingReport) -> Table:
    table = Table(
        title="Engine ratio R(N) = X_engine(N) / X_scalebench(N)",
        title_justify="left",
        caption="the same model, precision, layout and N; above 1: the other engine is faster",
        caption_justify="left",
    )
    add_columns(
        table,
        ("engine", "precision", "layout", "N", "tok/s", "scalebench tok/s", "ratio"),
        ("engine", "precision", "layout"),
    )
    for r in report.engine_ratios:
        table.add_row(
            r.engine,
            r.precision,
            r.layout,
            str(r.num_devices),
            f"{r.tokens_per_sec:,.0f}",
            f"{r.scalebench_tokens_per_sec:,.0f}",
            f"{r.ratio:.3f}",
        )
    return table


def speedup_table(report: ScalingReport) -> Table:
    table = Table(
        title="fp8 speedup S(N) = X_fp8(N) / X_bf16(N)",
        title_justify="left",
        caption="steps ratio: fp8 steps / bf16 steps to the loss bf16 reached at the end of its run (> 1: fp8 "
        "needs more); at equal loss: speedup / steps ratio, ± the band from the seeds (short x%: fp8 never "
        "reached that loss). fp8 loss vs bf16: the gap at the end of the run from a line through the gap over "
        "the last quarter (held-out loss when evaluated) ± its band (steps and seeds; one seed: plus a "
        "seed-spread allowance); tracks: within 1% with a band narrower than 1%; differs: beyond 1% and the band; "
        "inconclusive while the gap itself still moves",
        caption_justify="left",
    )
    cols = ("fp8 recipe", "layout", "N", "fp8 tok/s", "bf16 tok/s", "speedup", "steps ratio", "at equal loss")
    add_columns(
        table, (*cols, "fp8 loss vs bf16"), left=("fp8 recipe", "layout", "fp8 loss vs bf16"), numbers_whole=False
    )
    for sp in report.speedups:
        loss = (
            short_verdict(sp.loss_numerics)
            if sp.loss_numerics is not None
            else (f"final {_num(sp.loss_rel_gap, '+.1%')}" if sp.loss_rel_gap is not None else "-")
        )
        table.add_row(
            sp.precision,
            sp.layout,
            str(sp.num_devices),
            f"{sp.fp8_tokens_per_sec:,.0f}",
            f"{sp.bf16_tokens_per_sec:,.0f}",
            f"{sp.speedup:.2f}x",
            f"{sp.steps_ratio:.3f} ±{sp.steps_ratio_band:.3f}"
            if sp.steps_ratio is not None and sp.steps_ratio_band is not None
            else _num(sp.steps_ratio, ".3f"),
            short_effective(sp.time_to_loss),
            loss,
        )
    return table


BREAKDOWN_COLUMNS = (
    ("step", "step_ms"),
    ("GEMM\nbf16", "gemm_bf16_ms"),
    ("GEMM\nfp8", "gemm_fp8_ms"),
    ("fp8\ncast", "fp8_cast_ms"),
    ("attn", "attention_ms"),
    ("elem-\nwise", "elementwise_ms"),
    ("optim", "optimizer_ms"),
    ("comm", "communication_ms"),
    ("comm\nexp.", "exposed_communication_ms"),
    ("idle", "idle_ms"),
)


def breakdown_table(breakdown: ExperimentBreakdown) -> Table:
    table = Table(
        title="Where the step time goes (ms per profiled step, median over ranks and runs)",
        title_justify="left",
        caption_justify="left",
        caption="step = GEMMs + fp8 amax/scale/cast + attention + elementwise + optimizer + exposed "
        "comm + idle; comm = exposed + overlapped (any collective running); exp% = exposed / step",
    )
    columns = ("precision", "layout", "N", *(c for c, _ in BREAKDOWN_COLUMNS), "exp%")
    add_columns(table, columns, ("precision", "layout"), numbers_whole=False)
    for s in breakdown.series:
        for p in s.points:
            table.add_row(
                s.precision,
                s.layout,
                str(p.num_devices),
                *(f"{getattr(p, key):.1f}" for _, key in BREAKDOWN_COLUMNS),
                _num(p.exposed_communication_share, ".1%"),
            )
    return table


def print_report(
    console: Console,
    report: ScalingReport,
    runs: list[dict[str, Any]] | None = None,
    breakdown: ExperimentBreakdown | None = None,
    projection: dict[str, Any] | str | None = None,
) -> None:
    """projection: the served projection (fetch_projection), or the problem that refused it (one note line)."""
    if runs:
        console.print(runs_table(runs))
    console.print(scaling_table(report))
    if isinstance(projection, str):
        console.print(f"note: no projection beyond the measured range: {projection}", highlight=False, soft_wrap=True)
    elif projection is not None and (table := projection_table(projection)) is not None:
        console.print(table)
    if report.speedups:
        console.print(speedup_table(report))
    if report.engine_ratios:
        console.print(engine_ratio_table(report))
    if breakdown is not None and breakdown.series:
        console.print(breakdown_table(breakdown))
    for note in [f"{s.key.label()}: {n}" for s in report.series for n in s.notes]:
        console.print(f"note: {note}")
