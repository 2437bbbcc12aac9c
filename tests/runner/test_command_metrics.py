"""A command engine's metrics come only from the program's own output, never from a line the request could have
put there: a command that echoes every placeholder (each on its own line, and all on one) yields no metric for any
parser, with the most metric-like data_path the path rules allow. The same command printing one real metrics line
succeeds (the parsers do read this harness). Real processes: `python -m runner.command`'s execute runs sh."""

from __future__ import annotations

import json

import pytest

from core.contracts.clusters import Cluster
from core.engines.command import COMMAND_FILE, PLACEHOLDERS
from core.engines.registry import command_file
from runner.command import execute
from tests.runner.conftest import make_spec

# as close to a metrics line as the data_path characters allow (no space, ':', '(' or '{')
DATA_NAME = "iteration=1/100,elapsed_time_per_iteration=1.0,lm_loss=1.0,step=1,tps=2000000000,loss=1.0.bin"
REAL_LINE = {
    "megatron-log": " iteration        1/       3 | elapsed time per iteration (ms): 12.5 | lm loss: 5.0E+00 |",
    "torchtitan-log": "step:  1  loss:  5.0000  memory: 1GiB  tps: 1,000  tflops: 1.0",
    "jsonl": '{"step": 1, "step_ms": 12.5, "loss": 5.0}',
}
ECHO_ALL = 'for a in "$@"; do echo "$a"; done; echo "$*"'


def _cluster(source: str, extra_line: str | None) -> Cluster:
    literal = (extra_line or "").replace("{", "{{").replace("}", "}}")  # a brace in a template is written twice
    code = ECHO_ALL + (f"; echo '{literal}'" if extra_line else "")
    if source == "jsonl":
        code = f'({code}) > "$1"'
    args = ["{metrics_file}"] if source == "jsonl" else []
    argv = ["sh", "-c", code, "sh", *args, *("{" + p + "}" for p in PLACEHOLDERS if p != "precision_args")]
    return Cluster(
        name="echo",
        vendor="cpu",
        device_name="cpu",
        gpus_per_node=1,
        engines={"echo": {"argv": argv, "metrics": source, "precisions": ["fp32"]}},
    )


def _run(tmp_path, source: str, extra_line: str | None):
    root = tmp_path / "root"
    (root / DATA_NAME).parent.mkdir(parents=True)
    (root / DATA_NAME).write_bytes(b"\0" * 1024)
    spec = make_spec(engine="command:echo", steps=3, warmup_steps=1, data_path=DATA_NAME, data_roots=[str(root)])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / COMMAND_FILE).write_text(json.dumps(command_file(spec, _cluster(source, extra_line), 1)))
    return execute(spec, run_dir)


@pytest.mark.parametrize("source", ["megatron-log", "torchtitan-log", "jsonl"])
def test_echoed_placeholders_are_no_metrics(tmp_path, source) -> None:
    result = _run(tmp_path, source, None)
    assert result.status == "failed" and result.error.kind == "no_metrics", result
    echoed = (tmp_path / "run" / "metrics.jsonl").read_text() if source == "jsonl" else result.error.message
    assert DATA_NAME in echoed  # the echo ran: the data path was in what the parser was given


@pytest.mark.parametrize("source", ["megatron-log", "torchtitan-log", "jsonl"])
def test_the_programs_own_metrics_line_is_read(tmp_path, source) -> None:
    result = _run(tmp_path, source, REAL_LINE[source])
    assert result.status == "succeeded", result.error
    assert len(result.steps) == 1 and result.steps[0].loss == 5.0
