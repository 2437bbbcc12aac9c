"""Why a run failed, against a real server (uvicorn on the test Postgres): `show`'s runs table says the error's
kind and message, `logs` of a run that failed without a log says them instead of "no log yet", and `plot -o DIR`
writes into the directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import db.runs
from cli.main import app as cli
from cli.report import run_error
from core.settings import Settings
from db.session import session_scope
from tests.live_server import live_server

LAUNCH = "command:own-stack: [Errno 2] No such file or directory: 'python3'"
EXITED = (
    "command:own-stack: the command exited with code 1\n--- last 2048 bytes of its log ---\n"
    "starting\n/usr/bin/python3: No module named 'torch'\n\n"
)


@pytest.fixture
def server(test_settings: Settings) -> Iterator[str]:
    with live_server(test_settings) as url:
        yield url


@pytest.fixture
def failed(server, api_token, pg_session_factory) -> tuple[int, list[int]]:
    """An experiment of two runs: one failed at launch without a log, one failed with a log."""
    spec = {"name": "fails", "model": "debug", "gpu_counts": [1, 2], "precisions": ["bf16"]}
    r = httpx.post(f"{server}/experiments", json=spec, headers={"Authorization": f"Bearer {api_token}"})
    assert r.status_code == 201, r.text
    exp_id, run_ids = r.json()["id"], sorted(run["id"] for run in r.json()["runs"])
    with session_scope(pg_session_factory) as s:
        assert db.runs.mark_failed(s, run_ids[0], "launch_error", LAUNCH)
        assert db.runs.store_log(s, run_ids[1], b"starting\nthe log of run 2\n", 26, final=True)
        assert db.runs.mark_failed(s, run_ids[1], "error", EXITED)
    return exp_id, run_ids


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_show_says_the_kind_and_message_of_each_failed_run(server, api_token, failed) -> None:
    exp_id, (launch_id, exited_id) = failed
    result = _invoke("show", str(exp_id), "--server", server, "--token", api_token)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.replace("│", " ").split())
    assert f"launch_error: {LAUNCH}" in flat
    # the headline, then the last line of the log tail the message carries
    headline = "error: command:own-stack: the command exited with code 1"
    assert f"{headline} … /usr/bin/python3: No module named 'torch'" in flat
    assert "--- last 2048 bytes" not in flat


def test_logs_of_a_run_that_failed_without_a_log_says_why(server, api_token, failed) -> None:
    _, (launch_id, exited_id) = failed
    result = _invoke("logs", str(launch_id), "--server", server, "--token", api_token)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: run {launch_id} failed without a log: launch_error: {LAUNCH}"
    assert "no log yet" not in result.output and "Traceback" not in result.output
    logged = _invoke("logs", str(exited_id), "--server", server, "--token", api_token)
    assert logged.exit_code == 0 and logged.stdout == "starting\nthe log of run 2\n"
    unknown = _invoke("logs", "999999", "--server", server)
    assert unknown.exit_code == 1 and "run 999999 does not exist" in unknown.stderr, unknown.output


def test_run_error_cell_is_one_line_cut_short() -> None:
    assert run_error({"error_kind": None, "error_message": None}) == ""
    assert run_error({"error_kind": "oom", "error_message": None}) == "oom"
    cell = run_error({"error_kind": "error", "error_message": "x" * 300 + "\n--- log tail ---\n" + "y" * 300})
    head, last = cell.removeprefix("error: ").split(" … ")
    assert head == "x" * 99 + "…" and last == "y" * 79 + "…"
    multi = run_error({"error_kind": "invalid_config", "error_message": "spec s.json:\n  field steps:\tmust be > 0"})
    assert multi == "invalid_config: spec s.json: field steps: must be > 0"


def test_plot_into_a_directory_writes_a_named_png_there(server, api_token, tmp_path: Path) -> None:
    points = [{"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0 * n} for n in (1, 2)]
    body = {"name": "cpu", "model": "debug", "cluster": "local-cpu", "seq_len": 256, "points": points}
    r = httpx.post(f"{server}/experiments/import", json=body, headers={"Authorization": f"Bearer {api_token}"})
    assert r.status_code == 201, r.text
    exp_id = r.json()["id"]
    result = _invoke("plot", str(exp_id), "-o", str(tmp_path), "--server", server)
    assert result.exit_code == 0, result.output
    png = tmp_path / f"experiment-{exp_id}-curves.png"
    assert png.read_bytes().startswith(b"\x89PNG") and f"wrote {png}" in result.stdout
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "c.png"  # under a file: no directory can be made there
    refused = _invoke("plot", str(exp_id), "-o", str(bad), "--server", server)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    message = " ".join(refused.stderr.split())  # the error console wraps long lines
    assert message.startswith(f"error: -o/--output '{bad}': cannot write the PNG there: [Errno"), message


def test_wait_says_where_runs_wait_when_none_starts(server, api_token) -> None:
    from cli.client import ApiClient, CliError
    from cli.runs import console, wait_for

    spec = {"name": "stuck", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"]}
    r = httpx.post(f"{server}/experiments", json=spec, headers={"Authorization": f"Bearer {api_token}"})
    assert r.status_code == 201, r.text  # no worker consumes the test server's queue
    with (
        ApiClient(server, api_token) as client,
        console.capture() as captured,
        pytest.raises(CliError, match="did not finish within 2 s"),
    ):
        wait_for(client, r.json()["id"], poll_s=0.2, timeout_s=2.0, queued_hint_s=0.5)
    said = " ".join(captured.get().split())
    assert said.count("no run has started in") == 1, said  # once, not every poll
    assert "all 1 are queued for cluster 'local-cpu'. A worker consuming its queue is busy" in said, said
