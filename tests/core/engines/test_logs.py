"""core.engines.logs on logs in the real formats of Megatron-LM, AMD Primus and TorchTitan 0.2.2 (fixtures in
tests/core/engines/logs/, each saying where its format comes from; log_formats.py writes the lines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.engines.logs import parse_metrics, read_log
from tests.core.engines.log_formats import loss_at, titan_step, titan_validation

LOGS = Path(__file__).parent / "logs"


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_megatron_log_steps_from_zero_and_its_validation_losses() -> None:
    log = read_log("megatron", _lines("megatron-lm.log"), tokens_per_step=8 * 4096, num_devices=8)
    assert [r.step for r in log.steps] == list(range(12))  # iterations 1..12 -> steps 0..11
    assert log.steps[0].step_ms == 3883.5 and log.steps[1].step_ms == 432.3
    assert log.steps[1].loss == pytest.approx(loss_at(1, 0), abs=1e-6)  # printed with 7 significant digits
    # iterations 5 and 10 during training, 12 "on validation set" at the end; the test set's line is not held-out
    assert [s for s, _ in log.evals] == [4, 9, 11]
    assert log.evals[0][1] == pytest.approx(loss_at(4, 100) + 0.05, abs=1e-6)
    assert all(v < 20 for _, v in log.evals)
    assert log.global_batch_size == 8


def test_primus_log_reads_the_instant_time_and_loss() -> None:
    log = read_log("megatron", _lines("primus-megatron.log"), tokens_per_step=128 * 8192, num_devices=8)
    assert [(r.step, r.step_ms) for r in log.steps][:3] == [(0, 13372.8), (1, 2701.3), (2, 2712.9)]
    assert log.steps[5].loss == pytest.approx(loss_at(5, 0), abs=1e-6)
    assert log.evals == [(4, 6.25)] and log.global_batch_size == 128


def test_a_number_cut_by_a_stray_byte_is_not_read_as_its_prefix() -> None:
    line = " iteration        2/      10 | elapsed time per iteration (ms): 431.5 | lm loss: 9.95\x007E+00 |"
    [step] = read_log("megatron", [line], tokens_per_step=8 * 4096, num_devices=8).steps
    assert step.step_ms == 431.5 and step.loss is None  # not 9.95
    [titan] = read_log(
        "torchtitan", ["step:  3  loss:  5.12\x00  tps: 18,585"], tokens_per_step=8192, num_devices=1
    ).steps
    assert titan.loss is None and titan.step_ms == pytest.approx(8192 / 18585 * 1000)


def test_torchtitan_log_with_colour_codes_and_validation_lines() -> None:
    lines = _lines("torchtitan-0.2.2.log")
    assert any("\x1b[31mstep:" in line for line in lines)  # as TorchTitan prints it
    log = read_log("torchtitan", lines, tokens_per_step=8 * 8192, num_devices=8)
    assert [r.step for r in log.steps] == list(range(12))  # steps 1..12 -> 0..11; "validate step" is not one
    assert log.steps[1].step_ms == pytest.approx(8192 / 9016 * 1000)  # tps is per device
    assert log.steps[4].loss == pytest.approx(loss_at(4, 0), abs=1e-5)  # printed with 5 decimals
    assert [s for s, _ in log.evals] == [4, 9]
    assert log.evals[1][1] == pytest.approx(loss_at(9, 100) + 0.05, abs=1e-4)
    assert log.global_batch_size is None


def test_the_command_engine_no_longer_reads_validation_lines_as_steps() -> None:
    """A validation line carries "step:" and "tps:" too: read as a training step it replaced step 5's loss."""
    lines = [titan_step(5, loss=4.5, tps=1000.0), titan_validation(5, loss=9.0)]
    (rec,) = parse_metrics("torchtitan-log", lines, tokens_per_step=8000, num_devices=8)
    assert (rec.step, rec.loss) == (5, 4.5)


def test_jsonl_log_keeps_steps_as_written_and_reads_eval_loss() -> None:
    lines = [
        json.dumps({"step": 0, "step_ms": 50.0, "loss": 5.0}),
        json.dumps({"step": 1, "tokens_per_sec": 2000.0, "loss": 4.0, "eval_loss": 4.4}),
        json.dumps({"step": 2, "eval_loss": 4.1}),  # held-out only: not a training step
        "not json",
    ]
    log = read_log("jsonl", lines, tokens_per_step=100, num_devices=1)
    assert [(r.step, r.step_ms, r.loss) for r in log.steps] == [(0, 50.0, 5.0), (1, 50.0, 4.0)]
    assert log.evals == [(1, 4.4), (2, 4.1)]
    with pytest.raises(ValueError, match="megatron, torchtitan, jsonl"):
        read_log("csv", lines, tokens_per_step=1, num_devices=1)
