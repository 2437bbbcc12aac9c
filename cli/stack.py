"""`scalebench up`: API + one worker + the scheduler in one command.

Embedded default: SQLite under .scalebench/ and kombu's filesystem broker (no server needed); with
DATABASE_URL / REDIS_URL (or SCALEBENCH_DATABASE_URL / SCALEBENCH_BROKER_URL) set, Postgres and Redis.
`alembic upgrade head` runs first. Children run in their own sessions with PDEATHSIG, so they die with
this process even on SIGKILL; Ctrl-C / SIGTERM stops them in order (SIGTERM, then SIGKILL after a grace).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from core.clusters import load_clusters
from core.procs import set_parent_death_signal
from core.settings import Settings

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 10.0


def create_local_token(name: str, env: dict[str, str] | None = None) -> str:
    """A new token on the configured database (SCALEBENCH_DATABASE_URL); raises RuntimeError on failure."""
    proc = subprocess.run([sys.executable, "-m", "db.admin", "create-token", "--name", name], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"creating a token failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


@dataclass
class Stack:
    host: str = "127.0.0.1"
    port: int = 8000
    with_worker: bool = True
    reaper_interval_s: float = 5.0
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Resolve the data dir once so that every child (API, worker, scheduler) shares one DB and broker.
        self.settings = Settings.from_env(self.env)
        self.env["SCALEBENCH_DATA_DIR"] = str(self.settings.data_dir)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_dir = self.settings.data_dir / "logs"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def queues(self) -> list[str]:
        return sorted({c.queue_name for c in load_clusters(self.settings.clusters_file).values()})

    def migrate(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=REPO_ROOT, env=self.env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"alembic upgrade head failed:\n{proc.stderr[-3000:]}")

    def _spawn(self, name: str, args: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(args, cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                                preexec_fn=set_parent_death_signal)
        log.info("started %s (pid %d), log %s", name, self.procs[name].pid, self.log_dir / f"{name}.log")

    def start(self, ready_timeout_s: float = 60.0) -> None:
        self.migrate()
        py = sys.executable
        self._spawn("api", [py, "-m", "uvicorn", "api.app:create_app", "--factory", "--host", self.host,
                            "--port", str(self.port), "--log-level", "warning"])
        if self.with_worker:
            # --pool solo: the run executes in the worker process itself, so a SIGKILLed worker takes its
            # torchrun down (PDEATHSIG); one run at a time per node.
            self._spawn("worker", [py, "-m", "celery", "-A", "worker.main:app", "worker", "-n", "scalebench@%h",
                                   "-Q", ",".join(self.queues), "--pool", "solo", "--concurrency", "1",
                                   "--prefetch-multiplier", "1", "--loglevel", "INFO"])
        # reaper (expired leases, finished run dirs, re-publishing) + the nightly suites, one process
        self._spawn("scheduler", [py, "-m", "worker.scheduler", "--reap-interval-s", str(self.reaper_interval_s)])
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the API did not answer on {self.url}/healthz within {timeout_s:.0f} s "
                           f"(see {self.log_dir / 'api.log'})")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with code {proc.returncode}; its log ends with:\n{tail}")

    def create_token(self, name: str = "scalebench-up") -> str:
        """A fresh API token, also saved (0600) as <data dir>/token for the CLI."""
        token = create_local_token(name, env=self.env)
        path = self.settings.data_dir / "token"
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(token + "\n")
        return token

    def stop(self) -> None:
        """SIGTERM every child (scheduler and API first, the worker last), SIGKILL after a grace."""
        order = [n for n in ("scheduler", "api", "worker") if n in self.procs]
        for name in order:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name in order:
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s: SIGKILL", name, STOP_GRACE_S)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def serve_forever(stack: Stack) -> int:
    """Block until Ctrl-C / SIGTERM (exit 0) or a child dies (exit 1)."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    try:
        while not stopping:
            stack.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    return 0
