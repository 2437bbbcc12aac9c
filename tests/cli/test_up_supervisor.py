"""`scalebench up` for real (SQLite + filesystem broker, API + worker + scheduler): it heals a SIGKILLed worker,
stops within seconds on SIGTERM with the run requeued and nothing left running, refuses a port held by another
process before claiming success, and reuses its saved token."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml

from cli.stack import port_problem
from db.models import Run
from db.session import make_engine
from osutil import procs
from tests.worker.conftest import REPO, TINY, wait_until

CLI = [sys.executable, "-m", "cli.main"]
EMBEDDED_OVERRIDES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SCALEBENCH_DATABASE_URL",
    "SCALEBENCH_BROKER_URL",
    "SCALEBENCH_CLUSTERS_FILE",
    "SCALEBENCH_RUNS_DIR",
)


OK_SERVER = """import http.server, sys  # BaseHTTPRequestHandler answering 200
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Up:
    """One `python -m cli.main up` process on a data dir, its log, and HTTP helpers."""

    def __init__(self, tmp: Path, port: int, *args: str, name: str = "up") -> None:
        self.tmp, self.port, self.data = tmp, port, tmp / "data"
        self.env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_OVERRIDES}
        self.env |= {"SCALEBENCH_DATA_DIR": str(self.data), "SCALEBENCH_URL": self.url}
        self.log_path = tmp / f"{name}.log"
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [*CLI, "up", "--port", str(port), *args],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_up(self) -> None:
        wait_until(lambda: "Ctrl-C stops everything" in self.log() or self.proc.poll() is not None, 120, "up")
        assert self.proc.poll() is None, self.log()

    def children(self) -> dict[str, int]:
        """{'api' | 'worker' | 'scheduler': pid} of up's live children."""
        out = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for pid in map(int, (task / "children").read_text().split()):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                name = "worker" if b"celery" in cmd else "scheduler" if b"worker.scheduler" in cmd else "api"
                out[name] = pid
        return out

    def token(self) -> str:
        return (self.data / "token").read_text().strip()

    def submit(self, **spec) -> int:
        body = {"name": "up supervisor test", "precisions": ["fp32"], "gpu_counts": [1]} | TINY | spec
        r = httpx.post(
            f"{self.url}/experiments", json=body, headers={"Authorization": f"Bearer {self.token()}"}, timeout=30
        )
        assert r.status_code == 201, r.text
        return r.json()["runs"][0]["id"]

    def run(self, run_id: int) -> dict:
        return httpx.get(f"{self.url}/runs/{run_id}", timeout=10).json()

    def wait_stepping(self, run_id: int, min_step: int = 1) -> None:
        run_dir = self.data / "runs" / f"run-{run_id}"

        def stepped() -> bool:
            # each claim has its own directory, run-N/lease-K: the newest is the attempt in progress
            logs = sorted(run_dir.glob("lease-*/log.txt"), key=lambda p: int(p.parent.name.removeprefix("lease-")))
            text = logs[-1].read_text(errors="replace") if logs else ""
            launches = text.split("[scalebench]")[1:]
            return bool(launches) and any(int(n) >= min_step for n in re.findall(r"step (\d+)/", launches[-1]))

        wait_until(stepped, 180, f"run {run_id} to log step {min_step}")

    def run_pids(self) -> list[int]:
        return procs.pids_with_arg_like(str(self.data / "runs") + os.sep, f"{os.sep}spec.json")

    def stop(self) -> float:
        """SIGTERM up; seconds until it exited (exit code 0 asserted)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        elapsed_s = time.monotonic() - t0
        assert code == 0, self.log()
        return elapsed_s

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        procs.signal_pids(self.run_pids(), signal.SIGKILL)


def _stored_run(data: Path, run_id: int) -> Run:
    engine = make_engine(f"sqlite:///{data / 'scalebench.db'}")
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(Run).where(Run.id == run_id)).one()
    finally:
        engine.dispose()


@pytest.mark.slow
def test_worker_sigkilled_under_up_is_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    up = Up(tmp_path, _free_port())
    try:
        up.wait_up()
        run_id = up.submit(steps=300)
        up.wait_stepping(run_id)
        before = up.children()
        os.kill(before["worker"], signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: not up.run_pids(), 20, "torchrun and its ranks to end with the worker (PDEATHSIG)")
        assert httpx.get(f"{up.url}/healthz", timeout=5).status_code == 200  # the API stayed up
        assert up.proc.poll() is None
        wait_until(lambda: (w := up.children().get("worker")) and w != before["worker"], 30, "a new worker")
        after = up.children()
        assert after["api"] == before["api"] and after["scheduler"] == before["scheduler"]
        # The reaper sees the dead worker's pid: the run is requeued without waiting for its 30 s lease.
        wait_until(lambda: up.run(run_id)["attempts"] == 2, 60, "the run to be claimed again")
        requeued_s = time.monotonic() - t_kill
        run = wait_until(
            lambda: (r := up.run(run_id))["status"] in ("succeeded", "failed") and r,
            240,
            "the run to end on the restarted worker",
        )
        assert run["status"] == "succeeded" and run["attempts"] == 2, run
        assert _stored_run(up.data, run_id).worker.endswith(f":{after['worker']}")
        assert re.search(r"worker \(pid \d+\) exited with code -9 .*restarting it", up.log()), up.log()
        assert "worker restarted (restart 1)" in up.log()
        assert requeued_s < 25, requeued_s
        print(f"kill -9 to re-claim: {requeued_s:.1f} s")
    finally:
        up.kill()


@pytest.mark.slow
def test_sigterm_of_up_mid_run_stops_within_5s_requeues_the_run_and_the_next_up_finishes_it(tmp_path: Path) -> None:
    port = _free_port()
    first = Up(tmp_path, port, name="up-1")
    try:
        first.wait_up()
        run_id = first.submit(steps=300)
        first.wait_stepping(run_id)
        assert len(first.run_pids()) == 2  # torchrun + its rank
        children = first.children()
        stop_s = first.stop()
        print(f"SIGTERM of up mid-run: exited in {stop_s:.2f} s")
        assert stop_s < 5, first.log()
        assert not [pid for pid in children.values() if procs.is_alive(pid)], "a child of up outlived it"
        assert not first.run_pids(), "torchrun or a rank outlived up"
        run = _stored_run(first.data, run_id)
        assert run.status == "queued" and run.attempts == 0 and run.dispatched_at is None, run
        assert run.error_message.startswith("requeued: its worker was stopped mid-run"), run.error_message
    finally:
        first.kill()
    second = Up(tmp_path, port, name="up-2")
    try:
        second.wait_up()
        run = wait_until(
            lambda: (r := second.run(run_id))["status"] in ("succeeded", "failed") and r,
            240,
            "the requeued run to finish after the restart",
        )
        assert run["status"] == "succeeded" and run["attempts"] == 1, run
        assert second.stop() < 5  # idle: quick as well
    finally:
        second.kill()


@pytest.mark.slow
def test_up_reuses_the_saved_token_while_the_api_accepts_it(tmp_path: Path) -> None:
    port = _free_port()
    tokens = []
    for i in range(3):
        if i == 2:
            (tmp_path / "data" / "token").write_text("not-a-token-the-api-knows\n")
        up = Up(tmp_path, port, "--no-worker", name=f"up-{i}")
        try:
            up.wait_up()
            tokens.append(up.token())
            line = next(line for line in up.log().splitlines() if "token (" in line)
            assert line.endswith(tokens[-1])
            assert ("reused from" in line) == (i == 1), line
            assert up.stop() < 5
        finally:
            up.kill()
    assert tokens[0] == tokens[1] != tokens[2] and len(tokens[2]) > 20


@pytest.mark.slow
def test_up_on_a_port_in_use_fails_before_claiming_success_and_names_the_holder(tmp_path: Path) -> None:
    port = _free_port()
    # Another server that answers 200 on every path, /healthz included (as another API would).
    other = subprocess.Popen(
        [sys.executable, "-c", OK_SERVER, str(port)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: port_problem("127.0.0.1", port), 10, "the other server to listen")
        t0 = time.monotonic()
        up = Up(tmp_path, port)
        code = up.proc.wait(60)
        out = up.log()
        assert code == 1, out
        assert "scalebench is up" not in out and "token" not in out
        assert f"port {port} on 127.0.0.1 is already in use by pid {other.pid} (" in out and "BaseHTTP" in out
        assert not (tmp_path / "data" / "scalebench.db").exists()  # nothing was started or migrated
        print(f"up on a taken port failed in {time.monotonic() - t0:.1f} s")
    finally:
        other.kill()
        other.wait()


def test_port_problem_names_this_process_and_is_none_when_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        problem = port_problem("127.0.0.1", port)
        assert problem is not None and f"in use by pid {os.getpid()} (" in problem
        assert procs.tcp_listener_pids(port) == [os.getpid()]
    assert port_problem("127.0.0.1", port) is None


def test_submit_on_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "x"}))
    out = subprocess.run(
        [*CLI, "submit", str(tmp_path), "--server", "http://127.0.0.1:9"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "is a directory" in out.stderr and "does not exist" not in out.stderr, out
