"""A rank that a signal kills (the host's OOM killer, an operator) is named in the recorded message: torchrun itself
exits 1 and only its summary in the log says "exitcode: -9" (worker.execution.failure_message)."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from osutil import procs
from tests.worker.conftest import wait_until
from tests.worker.test_local_launcher import _spec
from worker.execution import failure_message
from worker.launchers.local import LocalLauncher


def _rank_of(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    values = [e.removeprefix(b"RANK=") for e in env if e.startswith(b"RANK=")]
    return int(values[0]) if values else None


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_in_the_message(tmp_path: Path) -> None:
    launcher = LocalLauncher(kill_grace_s=3)
    handle = launcher.start(_spec(steps=100000, timeout_s=300), "killed", tmp_path)
    pids = wait_until(lambda: len(p := procs.pids_with_arg(handle.extra["spec_arg"])) == 3 and p, 60, "2 ranks")
    log = tmp_path / "log.txt"
    wait_until(lambda: "[rank1] runner.parallel" in log.read_text(errors="replace"), 60, "rank 1 to build its model")
    (rank1,) = [p for p in pids if p != handle.pid and _rank_of(p) == 1]
    os.kill(rank1, signal.SIGKILL)
    outcome = wait_until(lambda: (o := launcher.poll(handle)).state not in ("running", "pending") and o, 60, "end")
    assert (outcome.state, outcome.error_kind, outcome.result) == ("failed", "error", None), outcome.log_tail
    message = failure_message(outcome)
    assert message.startswith("torchrun exited with code 1 and result.json was not written: "), message
    assert message.endswith("rank 1 killed by SIGKILL (signal 9; a host out-of-memory kill looks like this)"), message
    assert "rank 0" not in message  # stopped by torchrun with SIGTERM once rank 1 died: not the cause
    raised = outcome.log_tail.replace("exitcode  : -9", "exitcode  : 1")  # a root cause that exited, not signalled
    assert failure_message(replace(outcome, log_tail=raised)) == outcome.message
