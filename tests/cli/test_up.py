"""The CLI: readable problem details, an unreachable server without a traceback, a port or clusters file that
`scalebench up` cannot use refused in one line, its children's PATH, and `scalebench up` for real (SQLite +
filesystem broker, API + worker + scheduler) driven by `submit --wait`, `show`, `logs`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from cli.client import format_problem
from cli.main import app
from cli.stack import Stack
from osutil import procs
from tests.worker.conftest import REPO, TINY, wait_until

runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_problem_details_are_shown_field_by_field(client) -> None:
    response = client.post(
        "/experiments",
        json={"name": "x", "model": "debug", "gpu_counts": [0], "precisions": ["fp9"], "layouts": ["bad"]},
    )
    text = format_problem(response)
    assert text.startswith("HTTP 422")
    assert "  gpu_counts[0]: " in text
    assert (
        "precisions[0]: " in text
        and (
            "(allowed: bf16, fp8-tensorwise, fp8-rowwise, fp8-rowwise-gw-hp, "
            "mxfp8-cublas, mxfp8-cublas-floor, mxfp8-emulated, fp32)"
        )
        in text
    )
    assert "layouts: layout 'bad' is not one of" in text


def test_unreachable_server_is_one_clear_line_without_traceback() -> None:
    result = runner.invoke(app, ["ls", "--server", f"http://127.0.0.1:{_free_port()}"])
    assert result.exit_code == 1
    assert "cannot reach the scalebench API" in result.output and "scalebench up" in result.output
    assert "Traceback" not in result.output


def test_bad_spec_files_are_named(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["submit", str(tmp_path / "nope.yaml"), "--server", "http://127.0.0.1:9"])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    listed = runner.invoke(app, ["submit", str(tmp_path / "list.yaml"), "--server", "http://127.0.0.1:9"])
    assert listed.exit_code == 1 and "must hold a mapping" in listed.output


def _up_env(monkeypatch, tmp_path: Path, clusters_file: str | None = None) -> None:
    for key in ("DATABASE_URL", "REDIS_URL", "SCALEBENCH_DATABASE_URL", "SCALEBENCH_BROKER_URL", "SCALEBENCH_RUNS_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SCALEBENCH_DATA_DIR", str(tmp_path / "data"))
    if clusters_file is None:
        monkeypatch.delenv("SCALEBENCH_CLUSTERS_FILE", raising=False)
    else:
        monkeypatch.setenv("SCALEBENCH_CLUSTERS_FILE", clusters_file)


@pytest.mark.parametrize("port", [0, 70000, -1])
def test_up_refuses_a_port_outside_1_65535(port: int, tmp_path: Path, monkeypatch) -> None:
    _up_env(monkeypatch, tmp_path)
    result = runner.invoke(app, ["up", "--port", str(port)])
    assert (result.exit_code, result.stderr) == (1, f"error: --port {port} is not a port: give one of 1-65535\n")
    assert "scalebench is up" not in result.stdout and not (tmp_path / "data").exists()


def test_up_with_a_bad_clusters_file_is_one_error_line(tmp_path: Path, monkeypatch) -> None:
    _up_env(monkeypatch, tmp_path, "/nope.toml")
    missing = runner.invoke(app, ["up", "--port", str(_free_port())])
    assert (missing.exit_code, missing.stderr) == (
        1,
        "error: SCALEBENCH_CLUSTERS_FILE: clusters file '/nope.toml' does not exist\n",
    )
    bad = tmp_path / "clusters.toml"
    bad.write_text("[[cluster]\nname = 'x'\n")
    _up_env(monkeypatch, tmp_path, str(bad))
    invalid = runner.invoke(app, ["up", "--port", str(_free_port())])
    assert invalid.exit_code == 1 and isinstance(invalid.exception, SystemExit)
    assert invalid.stderr.startswith(f"error: SCALEBENCH_CLUSTERS_FILE: clusters file '{bad}': ")
    assert invalid.stderr.count("\n") == 1 and "line 1" in invalid.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was migrated or started


def test_up_children_find_this_interpreter_first_on_path(tmp_path: Path, monkeypatch) -> None:
    # a command engine's argv names `python3` (examples/clusters-own-stack.toml); without an activated venv
    # PATH finds another interpreter, one without torch
    _up_env(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin", str(Path(sys.executable).parent)]))
    stack = Stack(port=_free_port())
    assert stack.env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    out = subprocess.run(
        ["python3", "-c", "import sys, torch; print(sys.prefix)"],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == sys.prefix, out.stderr


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _assert_private(data_dir: Path) -> None:
    """runs/, logs/ and broker/ under the data dir and everything in them: the operator's only."""
    checked = 0
    for name in ("runs", "logs", "broker"):
        top = data_dir / name
        assert top.is_dir(), name
        for path in [top, *top.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o700 if path.is_dir() else 0o600), (str(path), oct(mode))
            checked += 1
    assert checked > 6


@pytest.mark.slow
def test_up_runs_an_experiment_end_to_end_and_stops_cleanly(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DATABASE_URL",
            "REDIS_URL",
            "SCALEBENCH_DATABASE_URL",
            "SCALEBENCH_BROKER_URL",
            "SCALEBENCH_CLUSTERS_FILE",
        )
    }
    port = _free_port()
    env |= {"SCALEBENCH_DATA_DIR": str(tmp_path / "data"), "SCALEBENCH_URL": f"http://127.0.0.1:{port}"}
    cli = [sys.executable, "-m", "cli.main"]
    with (tmp_path / "up.log").open("wb") as out:
        up = subprocess.Popen(
            [*cli, "up", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: "Ctrl-C stops everything" in (tmp_path / "up.log").read_text() or up.poll() is not None,
            90,
            "scalebench up",
        )
        assert up.poll() is None, (tmp_path / "up.log").read_text()
        assert (tmp_path / "data" / "scalebench.db").is_file()  # SQLite, migrated
        children = _children(up.pid)
        assert len(children) == 3  # api, worker, scheduler

        spec = tmp_path / "spec.yaml"
        # `lr: 3e-4` as people write it: a string in YAML 1.1 (a 422), a number in YAML 1.2 (cli.runs.Yaml12Loader)
        spec.write_text(
            yaml.safe_dump({"name": "up test", "precisions": ["fp32"], "gpu_counts": [1], **TINY}) + "lr: 3e-4\n"
        )
        submitted = subprocess.run(
            [*cli, "submit", str(spec), "--wait"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "experiment 1: succeeded" in submitted.stdout and "Scaling" in submitted.stdout
        shown = subprocess.run([*cli, "show", "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "succeeded" in shown.stdout
        logs = subprocess.run([*cli, "logs", "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert logs.returncode == 0 and "step 3/3" in logs.stdout
        stored = httpx.get(f"http://127.0.0.1:{port}/experiments/1", timeout=10).json()
        assert stored["spec"]["lr"] == 3e-4, stored["spec"]
        _assert_private(tmp_path / "data")
    finally:
        t0 = time.monotonic()
        up.send_signal(signal.SIGTERM)
        code = up.wait(30)
    assert code == 0 and time.monotonic() - t0 < 20
    wait_until(lambda: not any(procs.is_alive(pid) for pid in children), 5, "api, worker and scheduler to exit")
