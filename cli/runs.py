"""`scalebench submit | ls | show | cancel | logs`: the HTTP side of the CLI (registered by cli/main.py).

Every command takes --server (SCALEBENCH_URL) and --token (SCALEBENCH_TOKEN, else the token that
`scalebench up` saved). Errors print as one readable paragraph and exit 1; never a traceback.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from cli.client import ApiClient, CliError
from cli.report import add_columns, fetch_breakdown, fetch_projection, fetch_report, print_report

# Wide tables when the output is a file or a pipe (rich would wrap at 80 columns).
# markup off: names, notes and error messages come from specs and the server, and a "[...]" in them (a TOML table,
# a list of allowed values) is text to print, not a style
console = Console(width=None if sys.stdout.isatty() else 120, markup=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120, markup=False)
ServerOpt = Annotated[str | None, typer.Option("--server", envvar="SCALEBENCH_URL", help="API base URL.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="SCALEBENCH_TOKEN", help="API token (writes).")]
TERMINAL = ("succeeded", "failed", "cancelled")
_STEP_RE = re.compile(r"step (\d+)/(\d+)")


def utc_time(value: str | None, missing: str = "-") -> str:
    """An API timestamp (ISO 8601, UTC) as 'YYYY-MM-DD HH:MM:SS'; `missing` when there is none."""
    return value.replace("T", " ")[:19] if value else missing


def cli_errors(fn: Callable) -> Callable:
    """CliError -> its message on stderr, exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            err_console.print(Text.assemble(("error:", "red"), f" {exc}"), highlight=False)
            raise typer.Exit(1) from None

    return wrapper


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `3e-4` and `1e5` are numbers (YAML 1.1, which PyYAML reads,
    needs a dot: `3.0e-4`; every config copied from a paper or TorchTitan writes `3e-4`), `1_000.5` and
    sexagesimal `1:30.0` are strings."""


_FLOAT_TAG = "tag:yaml.org,2002:float"
Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+[eE][-+]?[0-9]+
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file: `.json` as JSON, anything else as YAML with YAML 1.2 numbers (Yaml12Loader)."""
    if path.is_dir():
        raise CliError(f"spec file {str(path)!r} is a directory; give the path of a YAML or JSON file in it")
    if not path.is_file():
        raise CliError(f"spec file {str(path)!r} does not exist")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(), parse_constant=_refuse_constant)
        except ValueError as exc:
            raise CliError(f"spec file {str(path)!r} is not valid JSON: {exc}") from None
    else:
        try:
            data = yaml.load(path.read_text(), Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise CliError(f"spec file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CliError(
            f"spec file {str(path)!r} must hold a mapping of ExperimentSpec fields, not {type(data).__name__}"
        )
    return data


def submit_spec(client: ApiClient, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    created = client.post("/experiments", json=spec, headers=headers)
    console.print(
        f"experiment {created['id']} ({created['name']}): {len(created['runs'])} runs on {created['cluster']}",
        highlight=False,
    )
    for s in created.get("skipped") or []:
        engine = "" if s.get("engine", "scalebench") == "scalebench" else f"{s['engine']}/"
        console.print(
            f"  skipped {engine}{s['precision']}/{s['layout']}/N={s['num_devices']}: {s['reason']}", highlight=False
        )
    if not created.get("dispatched", True):
        console.print(str(created.get("dispatch_message")), style="yellow", highlight=False)
    return created


def _engine_tag(run: dict[str, Any]) -> str:
    engine = run.get("engine", "scalebench")
    return "" if engine == "scalebench" else engine


def _run_label(run: dict[str, Any], engine_width: int = 0) -> str:
    """`run    7 torchtitan fp8-rowwise fsdp N=2`: the engine column as wide as the widest engine of the experiment
    (none where every run is the scalebench runner's), so the bars of every run line up."""
    seed = f" seed={run['seed']}" if run.get("seed") else ""
    engine = f"{_engine_tag(run):<{engine_width}} " if engine_width else ""
    return f"run {run['id']:>4} {engine}{run['precision']:<15} {run['layout']:<10} N={run['num_devices']:<3}{seed}"


def _step_progress(client: ApiClient, run_id: int) -> tuple[int, int] | None:
    """(step, steps) from the tail of the run's log, while it runs."""
    try:
        tail = client.text(f"/runs/{run_id}/log", tail_bytes=4000)
    except CliError:
        return None
    found = _STEP_RE.findall(tail)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def _duration(run: dict[str, Any]) -> str:
    if not (run.get("started_at") and run.get("finished_at")):
        return ""
    seconds = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    return f" in {seconds:.0f} s"


QUEUED_HINT_S = 30.0  # every run still queued this long after the wait began: say where they wait


def _queued_hint(exp: dict[str, Any], runs: list[dict[str, Any]], waited_s: float) -> str:
    return (
        f"no run has started in {waited_s:.0f} s: all {len(runs)} are queued for cluster {exp['cluster']!r}. "
        "A worker consuming its queue is busy with other runs, or none is running (`scalebench up` starts one "
        "for every configured cluster; GET /readyz checks the broker, not the workers)"
    )


def wait_for(
    client: ApiClient,
    experiment_id: int,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    queued_hint_s: float = QUEUED_HINT_S,
) -> dict:
    """Progress bars per run (steps from its log) until every run ended; returns the experiment. Says once why
    nothing moves when every run is still queued after queued_hint_s."""
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    hinted = False
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.fields[state]}", markup=False),
        console=console,
        transient=False,
    ) as progress:
        tasks: dict[int, Any] = {}
        while True:
            runs = client.all_runs(experiment_id)
            width = max((len(_engine_tag(r)) for r in runs), default=0)
            for run in runs:
                if run["id"] not in tasks:
                    tasks[run["id"]] = progress.add_task(_run_label(run, width), total=1, state=run["status"])
                task_id, status = tasks[run["id"]], run["status"]
                if status == "running" and (sp := _step_progress(client, run["id"])):
                    progress.update(task_id, total=sp[1], completed=sp[0], state=f"running step {sp[0]}/{sp[1]}")
                elif status in TERMINAL:
                    total = progress.tasks[task_id].total or 1
                    state = status if status != "failed" else f"failed ({run.get('error_kind')})"
                    progress.update(task_id, completed=total, state=state + _duration(run))
                else:
                    progress.update(task_id, state=status)
            if runs and all(r["status"] in TERMINAL for r in runs):
                return client.get(f"/experiments/{experiment_id}")
            waited = time.monotonic() - start
            if not hinted and waited >= queued_hint_s and runs and all(r["status"] == "queued" for r in runs):
                exp = client.get(f"/experiments/{experiment_id}")
                progress.console.print(_queued_hint(exp, runs, waited), style="yellow", highlight=False)
                hinted = True
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"experiment {experiment_id} did not finish within {timeout_s:.0f} s")
            time.sleep(poll_s)


def register(app: typer.Typer) -> None:
    """Add the commands to the `scalebench` app."""

    @app.command("submit")
    @cli_errors
    def submit(
        spec_file: Annotated[Path, typer.Argument(help="ExperimentSpec as YAML (or JSON).")],
        wait: Annotated[bool, typer.Option("--wait", help="Follow the runs until they end.")] = False,
        idempotency_key: Annotated[str | None, typer.Option(help="Repeat-safe submission key.")] = None,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Submit an experiment; with --wait, show progress per run and then the scaling table."""
        with ApiClient(server, token) as client:
            created = submit_spec(client, load_spec(spec_file), idempotency_key)
            if not wait:
                return
            exp = wait_for(client, created["id"])
            report, runs = fetch_report(client, created["id"])
            print_report(console, report, runs)
            console.print(f"experiment {exp['id']}: {exp['status']}")
            if exp["status"] != "succeeded":
                raise typer.Exit(1)

    @app.command("ls")
    @cli_errors
    def ls(
        limit: Annotated[int, typer.Option(help="How many (newest first).")] = 20,
        status: Annotated[str | None, typer.Option(help="Only experiments in this status.")] = None,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """List experiments, newest first."""
        with ApiClient(server, token) as client:
            page = client.get("/experiments", limit=limit, status=status)
        table = Table()
        add_columns(
            table,
            ("id", "name", "cluster", "status", "runs", "progress", "created"),
            left=("name", "cluster", "status", "created"),
        )
        for e in page["items"]:
            table.add_row(
                str(e["id"]),
                e["name"],
                e["cluster"],
                e["status"],
                str(e["num_runs"]),
                f"{e['progress']:.0%}",
                utc_time(e["created_at"]),
            )
        console.print(table)

    @app.command("show")
    @cli_errors
    def show(
        experiment_id: Annotated[int, typer.Argument(help="Experiment id.")],
        as_json: Annotated[bool, typer.Option("--json", help="The scaling report as JSON.")] = False,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """An experiment: its runs, the scaling table (throughput, efficiency, fp8 speedup) and the projection
        beyond the measured range (E(N) with its 80% interval)."""
        with ApiClient(server, token) as client:
            exp = client.get(f"/experiments/{experiment_id}")
            report, runs = fetch_report(client, experiment_id)
            if as_json:
                typer.echo(json.dumps(report.model_dump(mode="json"), indent=1))
                return
            breakdown = fetch_breakdown(client, experiment_id)
            projection = fetch_projection(client, experiment_id)
        console.print(
            f"experiment {exp['id']} {exp['name']} on {exp['cluster']}: {exp['status']} "
            f"({exp['num_runs']} runs, {exp['progress']:.0%} done)",
            highlight=False,
        )
        print_report(console, report, runs, breakdown, projection)

    @app.command("cancel")
    @cli_errors
    def cancel(
        experiment_id: Annotated[int, typer.Argument(help="Experiment id.")],
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Cancel an experiment: queued runs now, active runs (pending, e.g. waiting in Slurm's queue, or running)
        within seconds, by their worker."""
        with ApiClient(server, token) as client:
            out = client.post(f"/experiments/{experiment_id}/cancel")
        # num_cancelled: queued runs cancelled now; num_stopping: pending or running runs marked to stop (by this
        # call or an earlier one) that their worker has not ended yet
        queued, active = out["num_cancelled"], out["num_stopping"]
        console.print(
            f"experiment {experiment_id}: {queued} queued run{'' if queued == 1 else 's'} cancelled, "
            f"{active} active run{'' if active == 1 else 's'} (pending or running) stopping; status {out['status']}",
            highlight=False,
        )

    @app.command("logs")
    @cli_errors
    def logs(
        run_id: Annotated[int, typer.Argument(help="Run id.")],
        tail_bytes: Annotated[int, typer.Option(help="Bytes from the end of log.txt.")] = 65536,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """The tail of a run's log (the runner's merged stdout/stderr); a run that failed before it had one: its
        error kind and message."""
        with ApiClient(server, token) as client:
            text, missing = client.text_or_missing(f"/runs/{run_id}/log", tail_bytes=tail_bytes)
            if text is not None:
                typer.echo(text, nl=False)
                return
            run = client.get(f"/runs/{run_id}")  # an unknown run: its 404
        if run["status"] == "failed":
            raise CliError(
                f"run {run_id} failed without a log: {run.get('error_kind')}: {run.get('error_message') or '-'}"
            )
        raise CliError(missing or f"run {run_id} has no log (status {run['status']})")
