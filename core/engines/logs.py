"""Step metrics of a command engine, read from what the command itself writes (pure: no torch).

Sources (CommandEngineConfig.metrics):
- `jsonl`: a JSON-lines file the command writes, one object per step:
  {"step": 12, "step_ms": 431.5, "loss": 5.12}   (or "tokens_per_sec" (global) instead of "step_ms";
  "step" counts from 0 or 1, as the command likes: only the order matters)
- `megatron-log`: Megatron-LM's (and Primus-Megatron's) training log lines,
  " iteration       10/     100 | ... | elapsed time per iteration (ms): 431.5 | ... | lm loss: 5.120000E+00 |"
  The time is the mean over the log interval; with --log-interval 1 every step is seen.
- `torchtitan-log`: TorchTitan's metrics lines, "step: 10  loss:  5.1200  ...  tps: 18,585  tflops: ..."
  tps is tokens per second per device (TorchTitan divides by the non-data-parallel degree), so the step time is
  (global tokens per step / N) / tps.

Each parser returns StepMetric records in step order (a repeated step keeps its last line). Step times of a
command engine are the command's own figures, and its result says so (Summary.step_time_source).

Held-out loss (read_log, for imports of runs made elsewhere):
- Megatron-LM's evaluate_and_print_results (megatron/training/training.py):
  " validation loss at iteration 100 | lm loss value: 5.120000E+00 | lm loss PPL: 1.673E+02 | "
  (also "... at iteration 1000 on validation set | ..."; the test set's line and named extra validation sets,
  "validation-<name> loss at", are not the held-out curve and are skipped);
- TorchTitan 0.2.2's MetricsProcessor.log_validation (components/metrics.py):
  "validate step: 100  loss:  5.1200  memory: 30.12GiB(31.70%)  tps: 18,585", colour codes included;
- jsonl: {"step": 99, "eval_loss": 5.12} (a record may carry loss, step time and eval_loss together).
Megatron's iterations and TorchTitan's steps count from 1 and name the step just finished; read_log renumbers
them from 0 as scalebench's runner does (iteration 100 is step 99, its validation too), jsonl steps are taken
as written (from 0).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# a number ends at a space, '|', '/' (Primus: "13372.8/13372.8", instant/average) or the line's end, so that
# "9.95\x007E+00" is no 9.95
_END = r"(?=[\s|/]|$)"
_MEGATRON_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+")
_MEGATRON_MS_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)" + _END)
_MEGATRON_LOSS_RE = re.compile(r"\blm loss:\s*([0-9.eE+-]+|nan|inf)" + _END, re.IGNORECASE)
_MEGATRON_BATCH_RE = re.compile(r"\bglobal batch size:\s*(\d+)")
# " validation loss at iteration 100 | lm loss value: ..." or "... at iteration 100 on validation set | ..."
_MEGATRON_EVAL_RE = re.compile(r"\bvalidation loss at iteration\s+(\d+)(?: on validation set)?\s*\|")
_MEGATRON_EVAL_LOSS_RE = re.compile(r"\blm loss value:\s*([0-9.eE+-]+|nan|inf)" + _END, re.IGNORECASE)
_TITAN_STEP_RE = re.compile(r"(?<!validate )\bstep:\s*(\d+)\b")
_TITAN_EVAL_RE = re.compile(r"\bvalidate step:\s*(\d+)\b")
_TITAN_LOSS_RE = re.compile(r"\bloss:\s*([0-9.eE+-]+|nan|inf)" + _END, re.IGNORECASE)
_TITAN_TPS_RE = re.compile(r"\btps:\s*([0-9][0-9,]*(?:\.\d+)?)" + _END)


@dataclass(frozen=True)
class StepMetric:
    step: int  # as the command numbers it
    step_ms: float | None
    loss: float | None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _ordered(records: dict[int, StepMetric]) -> list[StepMetric]:
    return [records[k] for k in sorted(records)]


def parse_megatron_log(lines: list[str]) -> list[StepMetric]:
    out: dict[int, StepMetric] = {}
    for line in lines:
        line = _ANSI_RE.sub("", line)
        it = _MEGATRON_ITER_RE.search(line)
        ms = _MEGATRON_MS_RE.search(line)
        if it and ms:
            loss = _MEGATRON_LOSS_RE.search(line)
            step = int(it.group(1))
            out[step] = StepMetric(step, _number(ms.group(1)), _number(loss.group(1)) if loss else None)
    return _ordered(out)


def parse_torchtitan_log(lines: list[str], tokens_per_step_per_device: float) -> list[StepMetric]:
    out: dict[int, StepMetric] = {}
    for line in lines:
        line = _ANSI_RE.sub("", line)
        step, tps = _TITAN_STEP_RE.search(line), _TITAN_TPS_RE.search(line)
        if step and tps:
            rate = _number(tps.group(1))
            loss = _TITAN_LOSS_RE.search(line)
            step_ms = tokens_per_step_per_device / rate * 1000.0 if rate else None
            out[int(step.group(1))] = StepMetric(int(step.group(1)), step_ms, _number(loss.group(1)) if loss else None)
    return _ordered(out)


def parse_jsonl(lines: list[str], tokens_per_step: float) -> list[StepMetric]:
    """Lines that are not JSON objects with a step and a time are ignored (a command may log other things)."""
    out: dict[int, StepMetric] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
            continue
        step_ms = _number(str(rec["step_ms"])) if "step_ms" in rec else None
        if step_ms is None and "tokens_per_sec" in rec:
            rate = _number(str(rec["tokens_per_sec"]))
            step_ms = tokens_per_step / rate * 1000.0 if rate else None
        loss = _number(str(rec["loss"])) if "loss" in rec else None
        if step_ms is not None or loss is not None:
            out[rec["step"]] = StepMetric(rec["step"], step_ms, loss)
    return _ordered(out)


def parse_megatron_evals(lines: list[str]) -> dict[int, float | None]:
    """Held-out loss by iteration, as Megatron numbers it (the last line of an iteration wins)."""
    out: dict[int, float | None] = {}
    for line in lines:
        line = _ANSI_RE.sub("", line)
        if (it := _MEGATRON_EVAL_RE.search(line)) and (loss := _MEGATRON_EVAL_LOSS_RE.search(line)):
            out[int(it.group(1))] = _number(loss.group(1))
    return dict(sorted(out.items()))


def parse_torchtitan_evals(lines: list[str]) -> dict[int, float | None]:
    """Held-out loss by step, as TorchTitan numbers it."""
    out: dict[int, float | None] = {}
    for line in lines:
        line = _ANSI_RE.sub("", line)
        if (step := _TITAN_EVAL_RE.search(line)) and (loss := _TITAN_LOSS_RE.search(line, step.end())):
            out[int(step.group(1))] = _number(loss.group(1))
    return dict(sorted(out.items()))


def parse_jsonl_evals(lines: list[str]) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and type(rec.get("step")) is int and "eval_loss" in rec:
            out[rec["step"]] = _number(str(rec["eval_loss"]))
    return dict(sorted(out.items()))


def parse_metrics(source: str, lines: list[str], *, tokens_per_step: int, num_devices: int) -> list[StepMetric]:
    """The step metrics of one source; records without a positive step time are dropped."""
    if source == "megatron-log":
        records = parse_megatron_log(lines)
    elif source == "torchtitan-log":
        records = parse_torchtitan_log(lines, tokens_per_step / num_devices)
    elif source == "jsonl":
        records = parse_jsonl(lines, tokens_per_step)
    else:
        raise ValueError(f"metrics source {source!r} is not one of: jsonl, megatron-log, torchtitan-log")
    return [r for r in records if r.step_ms is not None and r.step_ms > 0]


# ------------------------------------------------------------------------------------- whole logs (imports)

LOG_FORMATS = ("megatron", "torchtitan", "jsonl")  # `scalebench import --format`, POST /experiments/import/logs
# the engine label of a log's run where the request names none
DEFAULT_LOG_ENGINES = {"megatron": "command:megatron", "torchtitan": "torchtitan", "jsonl": "scalebench"}
_FIRST_STEP = {"megatron": 1, "torchtitan": 1, "jsonl": 0}  # how each numbers its first step


@dataclass(frozen=True)
class ParsedLog:
    """What a training log says about one run, steps numbered from 0 (see the module's docstring)."""

    steps: list[StepMetric]  # every step with a time or a loss, in order
    evals: list[tuple[int, float | None]]  # (step after which the held-out loss was measured, loss)
    global_batch_size: int | None  # sequences per step, when the log states it (Megatron's iteration lines)


def read_log(fmt: str, lines: list[str], *, tokens_per_step: int, num_devices: int) -> ParsedLog:
    """Training steps (time, loss) and held-out losses of one log in a LOG_FORMATS format. tokens_per_step
    (global) converts TorchTitan's per-device tps and a jsonl tokens_per_sec into step times."""
    if fmt == "megatron":
        records = parse_megatron_log(lines)
        evals = parse_megatron_evals(lines)
        batches = [int(m.group(1)) for line in lines if (m := _MEGATRON_BATCH_RE.search(line))]
    elif fmt == "torchtitan":
        records = parse_torchtitan_log(lines, tokens_per_step / num_devices)
        evals = parse_torchtitan_evals(lines)
        batches = []
    elif fmt == "jsonl":
        records = parse_jsonl(lines, tokens_per_step)
        evals = parse_jsonl_evals(lines)
        batches = []
    else:
        raise ValueError(f"log format {fmt!r} is not one of: {', '.join(LOG_FORMATS)}")
    first = _FIRST_STEP[fmt]
    return ParsedLog(
        steps=[StepMetric(r.step - first, r.step_ms, r.loss) for r in records if r.step >= first],
        evals=[(step - first, loss) for step, loss in evals.items() if step >= first],
        global_batch_size=batches[-1] if batches else None,
    )
