"""`scalebench import LOG... --format ...` against a real server (uvicorn on the test Postgres): Megatron-style
and TorchTitan-style logs (tests/core/engines/log_formats.py) become an experiment with curves and a verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as cli
from core.settings import Settings
from tests.core.engines.log_formats import megatron_log, titan_log
from tests.live_server import live_server


@pytest.fixture
def server(test_settings: Settings) -> Iterator[str]:
    with live_server(test_settings) as url:
        yield url


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


HEAD = ["--model", "8b", "--num-layers", "4", "--cluster", "mi300x-node", "--vendor", "amd"]
HEAD += ["--device-name", "AMD Instinct MI300X", "--seq-len", "4096", "--local-batch-size", "1", "--num-devices", "8"]


def test_import_megatron_logs_prints_the_report_with_a_verdict(server, api_token, tmp_path) -> None:
    logs = [
        _write(tmp_path, f"{p}-s{s}.log", megatron_log(1000, seed=s, scale=f, step_ms=ms))
        for s in (0, 1)
        for p, f, ms in (("bf16", 1.0, 431.5), ("fp8", 1.03, 370.0))
    ]
    args = ["import", *logs, "--format", "megatron", *HEAD, "--name", "primus on mi300x"]
    args += ["--precision", "bf16", "--precision", "fp8-tensorwise"] * 2
    args += ["--seed", "0", "--seed", "0", "--seed", "1", "--seed", "1"]
    args += ["--stack", "distributed_optimizer=true, grad_reduce_bytes=2"]
    result = CliRunner().invoke(cli, [*args, "--server", server, "--token", api_token])
    assert result.exit_code == 0, result.output
    assert "4 runs imported on mi300x-node" in result.output
    assert "differs" in result.output and "1.17x" in result.output  # 431.5 / 370 ms, the verdict column
    exp_id = int(result.output.split("experiment ")[1].split()[0])
    curves = httpx.get(f"{server}/experiments/{exp_id}/losses").json()["curves"]
    assert sorted((c["precision"], c["seed"], c["engine"]) for c in curves) == [
        ("bf16", 0, "command:megatron"),
        ("bf16", 1, "command:megatron"),
        ("fp8-tensorwise", 0, "command:megatron"),
        ("fp8-tensorwise", 1, "command:megatron"),
    ]
    stacks = httpx.get(f"{server}/experiments/{exp_id}").json()["spec"]["stacks"]
    assert stacks == {"command:megatron": "distributed_optimizer=true,grad_reduce_bytes=2"}
    run_id = httpx.get(f"{server}/experiments/{exp_id}/runs").json()["items"][0]["id"]
    logs = CliRunner().invoke(cli, ["logs", str(run_id), "--server", server])
    assert logs.exit_code == 1 and "(status succeeded; imported runs keep none)" in logs.output, logs.output


def test_import_torchtitan_log_json_and_errors(server, api_token, tmp_path) -> None:
    log = _write(tmp_path, "titan.log", titan_log(40))
    auth = ["--server", server, "--token", api_token]
    result = CliRunner().invoke(
        cli, ["import", log, "--format", "torchtitan", *HEAD, "--precision", "bf16", "--json", *auth]
    )
    assert result.exit_code == 0, result.output
    assert '"engine": "torchtitan"' in result.output

    counts = CliRunner().invoke(
        cli,
        [
            "import",
            log,
            log,
            log,
            "--format",
            "torchtitan",
            *HEAD,
            "--precision",
            "bf16",
            "--seed",
            "0",
            "--seed",
            "1",
            *auth,
        ],
    )
    assert counts.exit_code == 1 and "--seed is given 2 times for 3 logs" in counts.output

    wrong = CliRunner().invoke(cli, ["import", log, "--format", "megatron", *HEAD, "--precision", "bf16", *auth])
    assert wrong.exit_code == 1 and "logs[0].text: no training step" in wrong.output
    assert "Traceback" not in wrong.output

    missing = CliRunner().invoke(
        cli, ["import", str(tmp_path / "nope.log"), "--format", "jsonl", *HEAD, "--precision", "bf16", *auth]
    )
    assert missing.exit_code == 1 and "does not exist" in missing.output
    titan = ["import", log, "--format", "torchtitan", *HEAD, "--precision", "bf16", *auth]
    runner_stack = CliRunner().invoke(cli, [*titan, "--stack", "grad_reduce_bytes=2"])
    assert runner_stack.exit_code == 1 and "these logs' engines (torchtitan) run the scalebench runner's" in (
        runner_stack.output
    )
    bad_stack = CliRunner().invoke(cli, [*titan, "--engine", "command:titan", "--stack", "grad_reduce_bytes=3"])
    assert bad_stack.exit_code == 1 and "--stack: grad_reduce_bytes: '3' is not one of 2, 4" in bad_stack.output
    fmt = CliRunner().invoke(cli, ["import", log, "--format", "nemo", *HEAD, "--precision", "bf16", *auth])
    assert fmt.exit_code == 1 and "megatron, torchtitan, jsonl" in fmt.output
