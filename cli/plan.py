"""`scalebench plan ID --tokens 1T --max-gpus 1024`: time and GPU-hours to train a token budget at each N, the
best precision x layout per N, the fastest plan within the cap and the cheapest one above an efficiency floor
(GET /experiments/{id}/plan; the numbers are the server's). Registered by cli/main.py."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.client import ApiClient, CliError
from cli.report import add_columns
from cli.runs import ServerOpt, TokenOpt, cli_errors, console
from core.contracts.stacks import STACK_FORM, parse_stack
from core.projection.plan import DEFAULT_MIN_EFFICIENCY, parse_token_count


def fetch_plan(
    client: ApiClient,
    experiment_id: int,
    tokens: float,
    max_gpus: int,
    cluster: str | None = None,
    gpu_hour_cost: float | None = None,
    min_efficiency: float = DEFAULT_MIN_EFFICIENCY,
    calibrate: bool | None = None,
    layouts: list[str] | None = None,
    stack: str | None = None,
) -> dict[str, Any]:
    """The server's plan; `layouts` None: its default layouts besides the measured ones, [] the measured only;
    `stack` the measured stack's description (core.projection.stack), None the runner's."""
    return client.get(
        f"/experiments/{experiment_id}/plan",
        tokens=repr(tokens),
        max_gpus=max_gpus,
        cluster=cluster,
        gpu_hour_cost=gpu_hour_cost,
        min_efficiency=min_efficiency,
        calibrate=None if calibrate is None else str(calibrate).lower(),
        layouts=None if layouts is None else ",".join(layouts),
        stack=stack,
    )


def _hours(h: float) -> str:
    return f"{h / 24:,.1f} d" if h >= 48 else f"{h:,.1f} h"


def _precision(o: dict[str, Any]) -> str:
    """The precision, after the engine when it is not this service's runner (e.g. `torchtitan fp8-rowwise`)."""
    engine = o.get("engine", "scalebench")
    return o["precision"] if engine == "scalebench" else f"{engine} {o['precision']}"


def _span(low: float | None, high: float | None, fmt) -> str:
    """'low-high' of a projected option's 80% interval ('2.7-3.2 d': a shared unit once); '-' when the server sent
    none (a measured point: its bounds are its value)."""
    if low is None or high is None or low == high:
        return "-"
    a, b = fmt(low), fmt(high)
    unit_a, unit_b = a.rpartition(" ")[2], b.rpartition(" ")[2]
    if " " in a and unit_a == unit_b:
        return f"{a.rpartition(' ')[0]}-{b}"
    if a.endswith("%") and b.endswith("%"):
        return f"{a[:-1]}-{b}"
    return f"{a}-{b}"


def _mark(o: dict[str, Any]) -> str:
    """A dagger after E(N) when the server explains the point (E above 100%, beyond the validated N)."""
    return " †" if o.get("note") else ""


def _row(o: dict[str, Any], with_cost: bool) -> list[str]:
    eff = "-" if o["efficiency"] is None else f"{o['efficiency']:.1%}"
    lo, hi = o.get("efficiency_low"), o.get("efficiency_high")
    if eff != "-" and lo is not None and hi is not None and lo != hi:  # the 80% interval, +- (clipped at 0 below)
        eff = f"{o['efficiency']:.1%} ±{100 * (hi - o['efficiency']):.1f}"
    eff += _mark(o)
    cells = [
        str(o["num_devices"]),
        _precision(o),
        o["layout"],
        o["source"],
        f"{o['tokens_per_sec']:,.0f}",
        eff,
        _hours(o["time_to_train_hours"]),
        _span(o.get("time_to_train_hours_low"), o.get("time_to_train_hours_high"), _hours),
        f"{o['gpu_hours']:,.0f}",
        _span(o.get("gpu_hours_low"), o.get("gpu_hours_high"), lambda v: f"{v:,.0f}"),
        "-" if o.get("time_at_equal_loss_hours") is None else _hours(o["time_at_equal_loss_hours"]),
        "-" if o.get("gpu_hours_at_equal_loss") is None else f"{o['gpu_hours_at_equal_loss']:,.0f}",
    ]
    return cells + ([f"{o['cost']:,.0f}"] if with_cost else [])


LOSS_COLUMNS = ("time @ loss", "GPU-h @ loss")
# Left out, first to last, while the table is wider than the terminal: the answer (N, precision, layout, E(N), time,
# GPU-hours) stays whole rather than every column cut short. --json has them all.
OPTIONAL_COLUMNS = ("GPU-h 80%", "time 80%", "GPU-h @ loss", "time @ loss", "X tok/s", "source", "cost")


def plan_table(plan: dict[str, Any], every_option: bool = False, width: int | None = None) -> tuple[Table, list[str]]:
    """The plan's rows as a table, and the columns left out of it: those at equal loss where no shown option has a
    measured time to loss, then OPTIONAL_COLUMNS in turn while the table is wider than `width` (None: no limit)."""
    with_cost = plan["gpu_hour_cost"] is not None
    table = Table(
        title=f"Plan: {plan['tokens']:.3g} tokens, at most {plan['max_gpus']} GPUs",
        title_justify="left",
        caption="source: measured where the point was measured, else projected on "
        f"{plan['network']['cluster']} ({plan['network']['source']})",
        caption_justify="left",
    )
    columns = (
        "N",
        "precision",
        "layout",
        "source",
        "X tok/s",
        "E(N) ±80%",
        "time",
        "time 80%",
        "GPU-hours",
        "GPU-h 80%",
        *LOSS_COLUMNS,
    ) + (("cost",) if with_cost else ())
    rows = [_row(o, with_cost) for o in _shown(plan, every_option)]
    keep = [i for i, col in enumerate(columns) if col not in LOSS_COLUMNS or any(r[i] != "-" for r in rows)]
    hidden = []
    cell = {i: max([len(columns[i]), *(len(r[i]) for r in rows)]) for i in range(len(columns))}
    for col in OPTIONAL_COLUMNS:
        # each column: its widest cell and one space each side, and a rule; one more rule closes the table
        if width is None or sum(cell[i] + 3 for i in keep) + 1 <= width:
            break
        i = columns.index(col) if col in columns else -1
        if i in keep:
            keep.remove(i)
            hidden.append(col)
    # what still does not fit narrows the text columns first and folds a cell, never cuts it (the report tables')
    add_columns(table, [columns[i] for i in keep], left=("precision", "layout", "source"))
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    return table, hidden


def _shown(plan: dict[str, Any], every_option: bool) -> list[dict[str, Any]]:
    return [
        o for row in plan["rows"] for o in (row["options"] if every_option else [row["best"]] if row["best"] else [])
    ]


def print_plan(plan: dict[str, Any], every_option: bool = False) -> None:
    table, hidden = plan_table(plan, every_option, width=console.width)
    console.print(table)
    at_loss = any(o.get("time_at_equal_loss_hours") is not None for o in _shown(plan, every_option))
    console.print(
        "±80%, 80%: the projection's 80% prediction interval (from its misses on published results it "
        "was not fitted to, leave one source out); measured points have none."
        + (
            " @ loss: at equal loss, fp8 needing steps_ratio x the tokens to reach the loss bf16 reaches with the "
            "budget (measured time to loss; - where none was measured)"
            if at_loss
            else ""
        ),
        highlight=False,
    )
    if hidden:
        console.print(
            f"not shown at this terminal's width: {', '.join(hidden)} (--json has every field)", highlight=False
        )
    for o in _shown(plan, every_option):
        if o.get("note"):
            console.print(f"† N={o['num_devices']} {_precision(o)} {o['layout']}: {o['note']}", highlight=False)
    floor = f"E(N) >= {plan['min_efficiency']:.0%}"
    for label, key in (
        ("fastest within the cap", "fastest"),
        (f"cheapest with {floor}", "cheapest_efficient"),
        (f"fastest with {floor}", "fastest_efficient"),
    ):
        o = plan[key]
        span = "" if o is None else _span(o.get("time_to_train_hours_low"), o.get("time_to_train_hours_high"), _hours)
        text = (
            "none"
            if o is None
            else (
                f"N={o['num_devices']} {_precision(o)} {o['layout']} ({o['source']}): "
                f"{_hours(o['time_to_train_hours'])}, {o['gpu_hours']:,.0f} GPU-hours"
                + (f" (80%: {span})" if span != "-" else "")
            )
        )
        console.print(f"{label}: {text}", highlight=False)
    for note in plan["notes"]:
        console.print(f"note: {note}", highlight=False)
    for line in plan.get("stacks", []):  # whose collectives the projection charged
        console.print(f"note: {line}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("plan")
    @cli_errors
    def plan(
        experiment_id: Annotated[int, typer.Argument(help="Experiment id.")],
        tokens: Annotated[str, typer.Option(help="Token budget: 1T, 500B, 1e12.")],
        max_gpus: Annotated[int, typer.Option(help="GPU cap of the plan.")],
        cluster: Annotated[
            str | None, typer.Option(help="Cluster whose network to project onto (default: the experiment's).")
        ] = None,
        gpu_hour_cost: Annotated[float | None, typer.Option(help="Price of one GPU-hour.")] = None,
        min_efficiency: Annotated[
            float, typer.Option(help="Efficiency floor of the cheapest plan (a fraction).")
        ] = DEFAULT_MIN_EFFICIENCY,
        calibrate: Annotated[
            bool | None,
            typer.Option(
                "--calibrate/--no-calibrate",
                help="Fit the projection to the measured points beyond N0 (--no-calibrate: from N0 alone). "
                "Default: where a measured point beyond N0 spans nodes.",
                show_default=False,
            ),
        ] = None,
        layouts: Annotated[
            list[str] | None,
            typer.Option(
                "--layout",
                help="Also plan this layout (repeatable), projected from the measured series: pp=4+tp=2+fsdp, "
                "cp=2+fsdp, ... (instead of the default pp=2, pp=4, pp=8 and cp=2 over each measured layout).",
            ),
        ] = None,
        measured_only: Annotated[
            bool, typer.Option("--measured-only", help="Plan with the measured layouts only (no pp / cp forms).")
        ] = False,
        stack: Annotated[
            str | None,
            typer.Option(
                help="The measured stack's data-parallel traffic and schedule where it is not the scalebench "
                "runner's (an imported series): " + STACK_FORM + ". Fields not given keep the runner's.",
            ),
        ] = None,
        every_option: Annotated[bool, typer.Option("--all", help="Every precision x layout per N.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="The plan as JSON.")] = False,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Time and GPU-hours to train a token budget per N; the fastest and the cheapest efficient plan."""
        try:
            budget = parse_token_count(tokens)
        except ValueError as exc:
            raise CliError(f"--{exc}") from None
        try:
            parse_stack(stack)
        except ValueError as exc:
            raise CliError(f"--stack: {exc}") from None
        if measured_only and layouts:
            raise CliError(
                "--measured-only and --layout exclude each other: --measured-only plans with the measured layouts only"
            )
        with ApiClient(server, token, timeout_s=60) as client:
            body = fetch_plan(
                client,
                experiment_id,
                budget,
                max_gpus,
                cluster,
                gpu_hour_cost,
                min_efficiency,
                calibrate,
                [] if measured_only else layouts,
                stack,
            )
        if as_json:
            typer.echo(json.dumps(body, indent=2))
        else:
            print_plan(body, every_option)
