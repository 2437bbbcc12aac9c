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
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+")
_MEGATRON_MS_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
_MEGATRON_LOSS_RE = re.compile(r"\blm loss:\s*([0-9.eE+-]+|nan|inf)", re.IGNORECASE)
_TITAN_STEP_RE = re.compile(r"\bstep:\s*(\d+)\b")
_TITAN_LOSS_RE = re.compile(r"\bloss:\s*([0-9.eE+-]+|nan|inf)", re.IGNORECASE)
_TITAN_TPS_RE = re.compile(r"\btps:\s*([0-9][0-9,]*(?:\.\d+)?)")


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
