"""`scalebench cancel` says what the API's cancel did: queued runs cancelled, active (pending or running) runs
marked to stop (by this call or an earlier one), each count with its own singular or plural."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.client import ApiClient
from cli.main import app as cli


def _cancel(monkeypatch: pytest.MonkeyPatch, num_cancelled: int, num_cancel_requested: int) -> str:
    answer = {
        "experiment_id": 5,
        "num_cancelled": num_cancelled,
        "num_cancel_requested": num_cancel_requested,
        "num_stopping": num_cancel_requested,
        "status": "running",
    }
    asked: list[str] = []

    def post(self, path, json=None, headers=None):
        asked.append(path)
        return answer

    monkeypatch.setattr(ApiClient, "post", post)
    result = CliRunner().invoke(cli, ["cancel", "5", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    assert asked == ["/experiments/5/cancel"]
    return " ".join(result.stdout.split())


def test_one_pending_run_is_an_active_run_in_the_singular(monkeypatch) -> None:
    said = _cancel(monkeypatch, 0, 1)
    assert said == "experiment 5: 0 queued runs cancelled, 1 active run (pending or running) stopping; status running"


def test_counts_above_one_are_plural(monkeypatch) -> None:
    said = _cancel(monkeypatch, 1, 3)
    assert said == "experiment 5: 1 queued run cancelled, 3 active runs (pending or running) stopping; status running"


def test_a_second_cancel_still_counts_the_runs_that_are_stopping(monkeypatch) -> None:
    answer = {"experiment_id": 5, "num_cancelled": 0, "num_cancel_requested": 0, "num_stopping": 2, "status": "running"}
    monkeypatch.setattr(ApiClient, "post", lambda self, path, json=None, headers=None: answer)
    result = CliRunner().invoke(cli, ["cancel", "5", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 0, result.output
    assert "2 active runs (pending or running) stopping" in " ".join(result.stdout.split())
