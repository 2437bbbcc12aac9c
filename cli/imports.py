"""`scalebench import LOG... --format megatron|torchtitan|jsonl`: the training logs of runs made elsewhere (an AMD
cluster running Primus or Megatron-LM, a TorchTitan job) as an imported experiment, through
POST /experiments/import/logs (registered by cli/main.py).

One log per run. The per-run options (--precision, --num-devices, --layout, --engine, --seed, --repeat) are given
once (every log) or once per log, in the order of the logs:

    scalebench import bf16-s0.log fp8-s0.log bf16-s1.log fp8-s1.log --format megatron \\
        --model 8b --num-layers 32 --cluster mi300x --vendor amd --device-name "AMD Instinct MI300X" \\
        --seq-len 4096 --local-batch-size 1 --num-devices 8 \\
        --precision bf16 --precision fp8-tensorwise --precision bf16 --precision fp8-tensorwise \\
        --seed 0 --seed 0 --seed 1 --seed 1

The server reads the logs (core.engines.logs); a log it cannot read, or a bad value, comes back as the field
that is wrong (logs[i].text, local_batch_size, ...). Then the scaling tables are printed, with the fp8 loss verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.client import ApiClient, CliError
from cli.report import fetch_report, print_report
from cli.runs import ServerOpt, TokenOpt, cli_errors, console
from core.contracts.stacks import STACK_FORM, parse_stack
from core.engines.logs import DEFAULT_LOG_ENGINES, LOG_FORMATS

MAX_LOG_BYTES = 32 << 20  # the server's limit per log (api.schemas.imports.MAX_LOG_CHARS)
IMPORT_TIMEOUT_S = 300.0  # parsing and storing a few large logs takes seconds on a small server

PER_LOG = ("precision", "num_devices", "layout", "engine", "seed", "repeat")


def per_log(name: str, values: list[Any] | None, num_logs: int) -> list[Any]:
    """One value per log from an option given once (every log), once per log, or not at all ([None] * n)."""
    if not values:
        return [None] * num_logs
    if len(values) == 1:
        return values * num_logs
    if len(values) != num_logs:
        option = "--" + name.replace("_", "-")
        raise CliError(
            f"{option} is given {len(values)} times for {num_logs} logs: give it once (every log) or once per log"
        )
    return list(values)


def read_logs(paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        if not path.is_file():
            raise CliError(f"log {str(path)!r} does not exist or is not a file")
        if path.stat().st_size > MAX_LOG_BYTES:
            raise CliError(
                f"log {str(path)!r} is {path.stat().st_size >> 20} MiB; at most {MAX_LOG_BYTES >> 20} MiB per log "
                "(keep the training lines: grep -E 'iteration|validation|step:' LOG > SHORTER.log)"
            )
        texts.append(path.read_text(errors="replace"))
    return texts


def logs_body(
    paths: list[Path], texts: list[str], fmt: str, head: dict[str, Any], options: dict[str, list[Any] | None]
) -> dict[str, Any]:
    """The POST /experiments/import/logs body: the experiment's head and one entry per log."""
    n = len(paths)
    columns = {name: per_log(name, options.get(name), n) for name in PER_LOG}
    if any(v is None for v in columns["precision"]):
        raise CliError("--precision is required: once (every log) or once per log")
    if any(v is None for v in columns["num_devices"]):
        raise CliError("--num-devices is required: once (every log) or once per log")
    logs = []
    for i, text in enumerate(texts):
        entry: dict[str, Any] = {"format": fmt, "text": text}
        entry |= {name: columns[name][i] for name in PER_LOG if columns[name][i] is not None}
        if head.get("warmup_steps") is not None:
            entry["warmup_steps"] = head["warmup_steps"]
        logs.append(entry)
    body = {k: v for k, v in head.items() if v is not None and k != "warmup_steps"}
    return body | {"logs": logs}


def command_stacks(fmt: str, engines: list[str | None], stack: str) -> dict[str, str]:
    """--stack as the experiment's `stacks`: the description, for each command engine of the logs."""
    try:
        parse_stack(stack)
    except ValueError as exc:
        raise CliError(f"--stack: {exc}") from None
    named = list(dict.fromkeys(e or DEFAULT_LOG_ENGINES[fmt] for e in engines))
    commands = [e for e in named if e.startswith("command:")]
    if not commands:
        raise CliError(
            f"--stack describes a command engine's stack; these logs' engines ({', '.join(named)}) run the "
            "scalebench runner's (give --engine command:<name>)"
        )
    return dict.fromkeys(commands, stack)


def register(app: typer.Typer) -> None:
    @app.command("import")
    @cli_errors
    def import_logs(
        logs: Annotated[list[Path], typer.Argument(help="Training logs, one per run.")],
        format: Annotated[str, typer.Option("--format", help=f"Log format: {', '.join(LOG_FORMATS)}.")],
        model: Annotated[str, typer.Option(help="Model shape the runs trained (e.g. 8b, 70b).")],
        cluster: Annotated[
            str, typer.Option(help="A configured cluster, or a new name (then --vendor, --device-name).")
        ],
        precision: Annotated[list[str], typer.Option(help="Precision of each run (once, or once per log).")],
        num_devices: Annotated[list[int], typer.Option(help="N of each run (once, or once per log).")],
        name: Annotated[str | None, typer.Option(help="Experiment name (default: from the first log's name).")] = None,
        num_layers: Annotated[int | None, typer.Option(help="Layers (default: the shape's).")] = None,
        vendor: Annotated[str | None, typer.Option(help="nvidia, amd or cpu (a new cluster).")] = None,
        device_name: Annotated[str | None, typer.Option(help="Device name (a new cluster; MFU when known).")] = None,
        seq_len: Annotated[int, typer.Option(help="Tokens per sequence of the runs.")] = 2048,
        local_batch_size: Annotated[int | None, typer.Option(help="Sequences per data-parallel rank (weak).")] = None,
        global_batch_size: Annotated[int | None, typer.Option(help="Sequences per step (strong scaling).")] = None,
        scaling: Annotated[str, typer.Option(help="weak or strong.")] = "weak",
        layout: Annotated[list[str] | None, typer.Option(help="Layout of each run (default fsdp).")] = None,
        engine: Annotated[
            list[str] | None,
            typer.Option(
                help="Engine label of each run (default: command:megatron, torchtitan, scalebench by format)."
            ),
        ] = None,
        seed: Annotated[list[int] | None, typer.Option(help="Seed of each run (default 0).")] = None,
        repeat: Annotated[list[int] | None, typer.Option(help="Repeat index of each run (default 0).")] = None,
        warmup_steps: Annotated[
            int | None, typer.Option(help="Logged steps left out of the throughput (default 1).")
        ] = None,
        compile: Annotated[bool, typer.Option("--compile", help="The runs used torch.compile.")] = False,
        stack: Annotated[
            str | None,
            typer.Option(
                help="How the logs' command engine (command:megatron by default for megatron logs) moves and "
                "schedules its data-parallel traffic, for the projection: "
                + STACK_FORM
                + ". Without it the projection charges the scalebench runner's stack.",
            ),
        ] = None,
        tag: Annotated[list[str] | None, typer.Option(help="Tags (repeatable).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the created experiment as JSON.")] = False,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Import training logs of runs made elsewhere as an experiment: throughput, loss per step, held-out loss
        where logged; then print its scaling tables and the fp8 loss verdict."""
        if format not in LOG_FORMATS:
            raise CliError(f"--format {format!r} is not one of: {', '.join(LOG_FORMATS)}")
        head = {
            "name": name or f"imported {format} logs: {logs[0].name}"[:200],
            "model": model,
            "num_layers": num_layers,
            "cluster": cluster,
            "vendor": vendor,
            "device_name": device_name,
            "scaling": scaling,
            "seq_len": seq_len,
            "local_batch_size": local_batch_size,
            "global_batch_size": global_batch_size,
            "compile": compile or None,
            "tags": tag or None,
            "warmup_steps": warmup_steps,
        }
        options: dict[str, list[Any] | None] = {
            "precision": precision,
            "num_devices": num_devices,
            "layout": layout,
            "engine": engine,
            "seed": seed,
            "repeat": repeat,
        }
        body = logs_body(logs, read_logs(logs), format, head, options)
        if stack is not None:
            body["stacks"] = command_stacks(format, per_log("engine", engine, len(logs)), stack)
        with ApiClient(server, token, timeout_s=IMPORT_TIMEOUT_S) as client:
            created = client.post("/experiments/import/logs", json=body)
            if as_json:
                console.print_json(json.dumps(created))
                return
            console.print(
                f"experiment {created['id']} ({created['name']}): {len(created['runs'])} runs imported "
                f"on {created['cluster']}",
                highlight=False,
            )
            report, runs = fetch_report(client, created["id"])
            print_report(console, report, runs)
