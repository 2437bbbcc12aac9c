"""`python -m runner.command --spec spec.json --out result.json`: a command engine's run on one node.

Reads command.json beside spec.json (written by the worker from the cluster's [cluster.engines.<name>] entry:
the command is the operator's, never the request's), fills the placeholders (core.engines.registry), starts the command
in this process group (a cancel or timeout of the run ends it with us), copies its output to our stdout (the
run's log.txt) and, on the first node, reads its step metrics (core.engines.logs) into a RunResult:

- exit code 0 and metrics read: succeeded, step times as the command measured them (Summary.step_time_source);
- a non-zero exit: failed, kind `error`, with the exit code and the last 2 kB of its log;
- exit code 0 but no metric the parser can read: failed, kind `no_metrics`, with the last 2 kB of its log.

Imports core only; torch is not imported (its version is read from the package metadata).
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import logging
import os
import platform
import signal
import socket
import subprocess
import sys
from pathlib import Path

from core.analysis.summary import summarize
from core.catalog.hardware import peak_tflops
from core.contracts import data_paths
from core.contracts.specs import Environment, ErrorKind, Numerics, RunError, RunResult, RunSpec, StepRecord
from core.engines.command import COMMAND_FILE, CommandEngineConfig, render_command, template_values
from core.engines.logs import StepMetric, parse_metrics
from runner.__main__ import load_spec, setup_logging, write_result

log = logging.getLogger("runner.command")
CODE_DIR = Path(__file__).resolve().parents[1]  # the scalebench checkout: {code_dir}
LOG_TAIL_BYTES = 2048  # of the command's output, in a failure's message
KEEP_LINES = 200_000  # output lines kept for a log parser (a 1,000-step run logs a few thousand)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec: RunSpec, command: CommandEngineConfig, run_dir: Path, num_nodes: int) -> dict:
    """The rendered launch of this node: argv, env, cwd, metrics source and file. {data_path} is the real path of
    the data file inside the cluster's data roots (absolute: never read as an option), checked here again."""
    if spec.data_path:
        spec = spec.model_copy(update={"data_path": str(data_paths.resolve(spec.data_path, spec.data_roots))})
    values = template_values(
        spec,
        nnodes=num_nodes,
        node_rank=int(os.environ.get("SLURM_NODEID", "0")),
        master_addr=os.environ.get("SCALEBENCH_MASTER_ADDR", "127.0.0.1"),
        master_port=int(os.environ.get("SCALEBENCH_MASTER_PORT") or _free_port()),
        run_dir=str(run_dir),
        code_dir=str(CODE_DIR),
    )
    return render_command(command, spec, values) | {"data_path": values["data_path"]}


def run_command(rendered: dict) -> tuple[int, list[str]]:
    """Start the command, copy its output line by line to stdout; (exit code, the lines kept)."""
    env = dict(os.environ) | rendered["env"]
    for key in ("SCALEBENCH_MASTER_ADDR", "SCALEBENCH_MASTER_PORT"):
        env.pop(key, None)
    log.info("starting: %s", " ".join(rendered["argv"]))
    lines: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
    proc = subprocess.Popen(
        rendered["argv"],
        cwd=rendered["cwd"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # SIGTERM to us (a cancel, a stopping worker) goes to the command too, also when it is not in our group
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    assert proc.stdout is not None
    for raw in proc.stdout:
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        lines.append(raw.decode("utf-8", "replace"))
    return proc.wait(), list(lines)


def _tail(lines: list[str]) -> str:
    return "".join(lines)[-LOG_TAIL_BYTES:]


def _failed(spec: RunSpec, kind: ErrorKind, message: str, lines: list[str]) -> RunResult:
    tail = _tail(lines)
    return RunResult(
        run_key=spec.run_key(),
        status="failed",
        error=RunError(
            kind=kind,
            message=f"{message}\n--- last {LOG_TAIL_BYTES} bytes of its log ---\n{tail}"[:20000],
            traceback_tail=tail or None,
        ),
    )


def result_from_metrics(spec: RunSpec, records: list[StepMetric], meta: dict, source: str) -> RunResult:
    """A succeeded RunResult from the command's own step records (warm-up: the first spec.warmup_steps)."""
    step_ms = [r.step_ms for r in records if r.step_ms is not None]
    losses = [r.loss for r in records]
    warmup = min(spec.warmup_steps, len(step_ms) - 1)  # at least one timed step
    bf16_peak, own_peak = peak_tflops(meta["device_name"], spec.precision)
    note = (
        None
        if bf16_peak
        else f"no MFU: device {meta['device_name']!r} is not in the peak table (core.catalog.hardware)"
    )
    summary = summarize(
        step_ms,
        warmup_steps=warmup,
        tokens_per_step=spec.tokens_per_step,
        num_devices=spec.num_devices,
        flops_per_token=spec.shape.flops_per_token(spec.seq_len),
        bf16_peak=bf16_peak,
        own_peak=own_peak,
        mfu_note=note,
        memory=(None, None),
        num_float8_linears=None,
        step_time_source=source,
    )
    steps = [
        StepRecord(step=i, loss=r.loss, step_ms=r.step_ms, tokens=spec.tokens_per_step, warmup=i < warmup)
        for i, r in enumerate(records)
    ]
    known = [v for v in losses if v is not None]
    env = Environment(
        vendor=meta["vendor"],
        device_name=meta["device_name"],
        device_count=spec.num_devices,
        torch_version=_version("torch") or "unknown",
        torchao_version=_version("torchao"),
        python_version=platform.python_version(),
        hosts=[socket.gethostname()],
        world_size=spec.num_devices,
        engine=spec.engine,
    )
    return RunResult(
        run_key=spec.run_key(),
        status="succeeded",
        steps=steps,
        summary=summary,
        numerics=Numerics(final_loss=known[-1] if known else None, loss_curve=known),
        environment=env,
    )


def own_lines(lines: list[str], request_texts: list[str]) -> list[str]:
    """The lines a metrics parser may read: not one that holds text the request chose (its data_path, as given
    and as resolved): a program that echoes its arguments must not make a metric out of them. Every other
    placeholder is a bounded number or a name from a fixed set, which cannot spell a metrics line."""
    texts = [t for t in request_texts if t]
    return [line for line in lines if not any(t in line for t in texts)]


def execute(spec: RunSpec, run_dir: Path) -> RunResult | None:
    """Run the command; the result on the first node, None on the others (the first node writes it)."""
    meta = json.loads((run_dir / COMMAND_FILE).read_text())
    command = CommandEngineConfig.model_validate(meta["command"])
    rendered = launch(spec, command, run_dir, meta["num_nodes"])
    code, lines = run_command(rendered)
    if os.environ.get("SLURM_NODEID", "0") != "0":
        return None
    if code != 0:
        return _failed(spec, "error", f"{spec.engine}: the command exited with code {code}", lines)
    source = command.metrics
    if source == "jsonl":
        path = Path(rendered["metrics_file"])
        metric_lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    else:
        metric_lines = lines
    metric_lines = own_lines(metric_lines, [spec.data_path or "", rendered["data_path"]])
    records = parse_metrics(source, metric_lines, tokens_per_step=spec.tokens_per_step, num_devices=spec.num_devices)
    if not records:
        where = rendered["metrics_file"] if source == "jsonl" else "its output"
        return _failed(
            spec,
            "no_metrics",
            f"{spec.engine}: the command exited 0 but {where} holds no step metric that the {source} parser can read",
            lines,
        )
    label = "jsonl" if source == "jsonl" else f"log:{source.removesuffix('-log')}"
    return result_from_metrics(spec, records, meta, f"the command's own figures ({label})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.command", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    setup_logging()
    spec, invalid = load_spec(args.spec)
    if spec is None:
        assert invalid is not None
        write_result(args.out, invalid)
        return 2
    try:
        result = execute(spec, args.spec.parent)
    except (OSError, ValueError, KeyError) as exc:  # a command that cannot start, a bad command.json, a data_path
        # that is not allowed (core.contracts.data_paths: one message for every such path)
        result = RunResult(
            run_key=spec.run_key(),
            status="failed",
            error=RunError(kind="launch_error", message=f"{spec.engine}: {exc}"[:20000]),
        )
    if result is None:
        return 0
    write_result(args.out, result)
    log.info("%s: %s", spec.engine, result.status if result.error is None else f"failed ({result.error.kind})")
    return 0 if result.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
