"""Worker integration fixtures: a private cluster + queue per test, real Celery worker processes, the API.

Everything is real: Postgres (TEST_DATABASE_URL), Redis (TEST_REDIS_URL), `celery worker` subprocesses
(--pool solo, as `scalebench up` and compose run them), torchrun + the runner on CPU (debug model, tiny).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from core.settings import Settings
from db.models import Run
from osutil import procs

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S, LEASE_S = 1.0, 4.0
# One layer, fp32: what the tests here check is the service around the runner (tests/runner checks the runner's
# shapes and numerics), and on CPUs without native bf16 an fp32 step costs 2-4x less than a bf16 one.
TINY = {
    "model": "debug",
    "num_layers": 1,
    "seq_len": 32,
    "local_batch_size": 1,
    "steps": 3,
    "warmup_steps": 1,
    "timeout_s": 300,
}
# Tens of seconds (logs every 100 steps): killed or cancelled mid-run. Its wall-clock limit is far off: on a slow,
# busy host 1,000 steps of two ranks have taken minutes, and the tests that let it finish do not test the limit.
LONG = TINY | {"steps": 1000, "timeout_s": 3600}


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class Cell:
    """One test's private cluster (its own Celery queue), settings and worker environment."""

    name: str
    tmp: Path
    settings: Settings
    env: dict[str, str]
    session_factory: sessionmaker[Session]
    token: str | None = None  # an API token of the cell's own database (SQLite cells), else the shared one

    def run(self, run_id: int) -> Run:
        with self.session_factory() as s:
            run = s.get(Run, run_id)
            assert run is not None
            return run

    def run_dirs(self, run_id: int) -> list[Path]:
        """The run's directories, one per claim that launched it (run-N/lease-K), oldest first."""
        found = (self.settings.runs_dir / f"run-{run_id}").glob("lease-*")
        return sorted((p for p in found if p.name[6:].isdigit()), key=lambda p: int(p.name[6:]))

    def run_dir(self, run_id: int, attempt: int | None = None) -> Path:
        """The directory of the run's `attempt`-th launch (1-based), by default the newest one."""
        dirs = self.run_dirs(run_id)
        assert dirs, f"run {run_id} has no run directory yet"
        return dirs[-1] if attempt is None else dirs[attempt - 1]

    def run_pids(self, run_id: int, attempt: int | None = None) -> list[int]:
        """Live torchrun/runner processes of a run (their command line names a spec.json of it): of one
        attempt's directory, or of any."""
        if attempt is not None:
            return procs.pids_with_arg(str(self.run_dir(run_id, attempt) / "spec.json"))
        return procs.pids_with_arg_like(str(self.settings.runs_dir / f"run-{run_id}") + "/", "/spec.json")

    def wait_status(self, run_id: int, statuses: tuple[str, ...], timeout_s: float = 120) -> Run:
        return wait_until(
            lambda: (r := self.run(run_id)).status in statuses and r, timeout_s, f"run {run_id} to reach {statuses}"
        )

    def wait_steps(self, run_id: int, min_step: int = 1, attempt: int = 1, timeout_s: float = 120) -> None:
        """Until attempt `attempt` (its launch's own directory) logged a training step (torch imported, model
        built: really running)."""

        def stepped() -> bool:
            dirs = self.run_dirs(run_id)
            log = dirs[attempt - 1] / "log.txt" if len(dirs) >= attempt else None
            text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
            return any(int(n) >= min_step for n in re.findall(r"step (\d+)/\d+", text))

        wait_until(stepped, timeout_s, f"run {run_id} attempt {attempt} to log step {min_step}")


@pytest.fixture
def cell(request, tmp_path: Path, pg_url: str, redis_url: str, pg_session_factory, redis_client) -> Iterator[Cell]:
    """A cell on PostgreSQL; `@pytest.mark.parametrize("cell", ["postgres", "sqlite"], indirect=True)` runs a test
    on both databases (SQLite: a fresh migrated file that the API, the workers and the scheduler share)."""
    database = getattr(request, "param", "postgres")
    engine = token = None
    if database == "sqlite":
        from db.session import make_engine, make_session_factory, session_scope
        from db.tokens import create_token

        pg_url = request.getfixturevalue("sqlite_url")
        engine = make_engine(pg_url)
        pg_session_factory = make_session_factory(engine)
        with session_scope(pg_session_factory) as session:
            token, _ = create_token(session, "tests")
    name = f"t-{uuid.uuid4().hex[:8]}"
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(
        f'[[cluster]]\nname = "{name}"\nvendor = "cpu"\ndevice_name = "cpu (gloo ranks)"\n'
        f'gpus_per_node = 4\nlauncher = "local"\n'
    )
    settings = Settings(
        data_dir=tmp_path,
        database_url=pg_url,
        broker_url=redis_url,
        clusters_file=str(clusters),
        runs_dir=tmp_path / "runs",
        heartbeat_s=HEARTBEAT_S,
        lease_s=LEASE_S,
        max_infra_retries=1,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        SCALEBENCH_DATABASE_URL=pg_url,
        SCALEBENCH_BROKER_URL=redis_url,
        SCALEBENCH_DATA_DIR=str(tmp_path),
        SCALEBENCH_RUNS_DIR=str(settings.runs_dir),
        SCALEBENCH_CLUSTERS_FILE=str(clusters),
        SCALEBENCH_HEARTBEAT_S=str(HEARTBEAT_S),
        SCALEBENCH_LEASE_S=str(LEASE_S),
        SCALEBENCH_MAX_INFRA_RETRIES="1",
        PYTHONUNBUFFERED="1",
    )
    yield Cell(name, tmp_path, settings, env, pg_session_factory, token)
    if engine is not None:
        engine.dispose()


@dataclass
class WorkerProc:
    proc: subprocess.Popen
    log_path: Path
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60) -> None:
        wait_until(lambda: " ready." in self.log() or self.proc.poll() is not None, timeout_s, "the worker")
        assert self.proc.poll() is None, f"worker exited:\n{self.log()[-3000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def start_worker(cell: Cell) -> Iterator[Callable[..., WorkerProc]]:
    """start_worker(env_extra=None) -> a ready `celery worker` on the cell's queue (stopped after the test)."""
    workers: list[WorkerProc] = []

    def start(env_extra: dict[str, str] | None = None, env: dict[str, str] | None = None) -> WorkerProc:
        log_path = cell.tmp / f"worker-{len(workers)}.log"
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.main:app",
            "worker",
            "-n",
            f"{cell.name}-{len(workers)}@%h",
            "-Q",
            cell.name,
            "--pool",
            "solo",
            "--concurrency",
            "1",
            "--prefetch-multiplier",
            "1",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
        ]
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=(env or cell.env) | (env_extra or {}),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        w = WorkerProc(proc, log_path)
        workers.append(w)
        w.wait_ready()
        return w

    yield start
    for w in workers:
        w.stop()
    # Nothing of this test may outlive it (a failed assertion must not leave ranks spinning).
    leftovers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _names(int(p.name), cell.tmp)]
    procs.signal_pids(leftovers, signal.SIGKILL)


def _names(pid: int, tmp: Path) -> bool:
    try:
        return str(tmp).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture
def api(make_client, cell: Cell):
    """A TestClient of the real app on the cell's settings (shares the test database and Redis)."""
    client = make_client(settings=cell.settings)
    if cell.token is not None:
        client.headers["Authorization"] = f"Bearer {cell.token}"
    return client


def submit(api, cell: Cell, **spec: Any) -> tuple[int, list[int]]:
    body = {"name": "worker test", "cluster": cell.name, "precisions": ["fp32"], "gpu_counts": [1]} | TINY | spec
    response = api.post("/experiments", json=body)
    assert response.status_code == 201, response.text
    data = response.json()
    assert data["dispatched"], data
    return data["id"], [r["id"] for r in data["runs"]]


def run_reaper_once(cell: Cell) -> str:
    """One pass of the real scheduler process (`python -m worker.scheduler --once`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker.scheduler", "--once"],
        cwd=REPO,
        env=cell.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr
