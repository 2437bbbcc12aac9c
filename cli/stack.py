"""`scalebench up`: API + one worker + the scheduler in one command, supervised.

Embedded default: SQLite under .scalebench/ and kombu's filesystem broker (no server needed); with
DATABASE_URL / REDIS_URL (or SCALEBENCH_DATABASE_URL / SCALEBENCH_BROKER_URL) set, Postgres and Redis.
The API port is checked first (a port held by another process fails the start, naming that process), then
`alembic upgrade head` runs. Children run in their own sessions with PDEATHSIG, so they die with this
process even on SIGKILL. A child that dies is restarted with back-off (logged); one that keeps dying right
after its start stops the stack. Ctrl-C / SIGTERM stops them all at once: the worker interrupts its run
(ends its processes, requeues it: worker.execution), SIGKILL after a grace, and nothing of the stack is
left running (process groups and every process of a run under the runs dir are swept).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from core.contracts.clusters import load_clusters
from core.settings import Settings
from osutil import procs
from osutil.private import private_dir, private_umask

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 8.0  # the worker ends its run (SIGTERM, SIGKILL after 5 s) and requeues it within this
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # after the 1st, 2nd, ... death in a row
STABLE_S = 60.0  # a child that ran this long before it died starts its back-off over
MAX_QUICK_DEATHS = 5  # deaths in a row, each within STABLE_S of its start, before the stack gives up
MAX_PORT = 65535
# what db.admin's traceback says when the database has no tables yet (SQLite, PostgreSQL)
NO_SCHEMA_MARKERS = ("no such table: api_tokens", 'relation "api_tokens" does not exist')


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child started in REPO_ROOT (API, worker, scheduler, db.admin): the data dir, runs dir
    and clusters file made absolute from this process's cwd (a relative SCALEBENCH_DATA_DIR is the user's, not
    the repository's), and this interpreter's bin directory first on PATH, as an activated venv has it (a command
    engine's `python3` or `torchrun` is the interpreter scalebench runs under)."""
    out = dict(env)
    settings = Settings.from_env(out)
    out["SCALEBENCH_DATA_DIR"] = str(settings.data_dir)
    if out.get("SCALEBENCH_RUNS_DIR"):
        out["SCALEBENCH_RUNS_DIR"] = str(settings.runs_dir)
    if settings.clusters_file:
        out["SCALEBENCH_CLUSTERS_FILE"] = str(Path(settings.clusters_file).absolute())
    bin_dir = str(Path(sys.executable).parent)  # not resolved: a venv's python is a link to the base interpreter
    path = [p for p in out.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir]
    out["PATH"] = os.pathsep.join([bin_dir, *path])
    return out


def _missing_sqlite_file(database_url: str) -> Path | None:
    """The file of an SQLite database URL (sqlite:////abs/path) that does not exist, else None."""
    if not database_url.startswith("sqlite:///"):
        return None
    path = Path(database_url.removeprefix("sqlite:///"))
    return path if path.is_absolute() and not path.exists() else None


def create_local_token(name: str, env: Mapping[str, str] | None = None, role: str = "admin") -> str:
    """A new token on the configured database (SCALEBENCH_DATABASE_URL), admin unless asked otherwise (the
    operator's); raises RuntimeError on failure, one line when the database has no schema yet."""
    env = child_env(os.environ if env is None else env)
    database_url = Settings.from_env(env).database_url
    no_schema = (
        f"the database {database_url.split('@')[-1]} has no scalebench tables yet: run `scalebench up` once with "
        "the same SCALEBENCH_DATA_DIR / SCALEBENCH_DATABASE_URL (it migrates the database), or "
        f"`alembic -c {REPO_ROOT / 'alembic.ini'} upgrade head`"
    )
    if _missing_sqlite_file(database_url):  # db.admin would create an empty file (and its directory)
        raise RuntimeError(no_schema)
    proc = subprocess.run(
        [sys.executable, "-m", "db.admin", "create-token", "--name", name, "--role", role],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        if any(marker in proc.stderr for marker in NO_SCHEMA_MARKERS):
            raise RuntimeError(no_schema)
        raise RuntimeError(f"creating a token failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def token_is_accepted(url: str, token: str, timeout_s: float = 5.0) -> bool:
    """Does the API at `url` accept this token for writes? Asked with an empty experiment: the token is
    checked before the body, so 401 means refused and 422 (the body) accepted; nothing is created."""
    try:
        response = httpx.post(
            f"{url}/experiments", json={}, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 422


def port_problem(host: str, port: int) -> str | None:
    """None when host:port can be listened on (as uvicorn binds: SO_REUSEADDR), else what holds it."""
    if not 1 <= port <= MAX_PORT:  # the socket would take it modulo 65536 (70000: 4464)
        return f"--port {port} is not a port: give one of 1-{MAX_PORT}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        return None
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    holders = procs.tcp_listener_pids(port)
    held_by = ", ".join(procs.describe(pid) for pid in holders) if holders else "another process (not visible here)"
    return f"port {port} on {host} is already in use by {held_by}; stop it or pass --port"


@dataclass
class Stack:
    host: str = "127.0.0.1"
    port: int = 8000
    with_worker: bool = True
    # Write <data dir>/token before the API answers /healthz (a client that waits for /healthz then reads the
    # token file must find one); `up` checks it against the API afterwards (ensure_token).
    with_token: bool = False
    reaper_interval_s: float = 5.0
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)  # monotonic s of each child's latest start
    quick_deaths: dict[str, int] = field(default_factory=dict)  # deaths in a row soon after a start
    restart_at: dict[str, float] = field(default_factory=dict)  # monotonic s at which a dead child restarts
    restarts: dict[str, int] = field(default_factory=dict)
    fresh_token: str | None = None  # created by start() before the API (with_token)

    def __post_init__(self) -> None:
        # Resolve the data dir once so that every child (API, worker, scheduler) shares one DB and broker.
        self.env = child_env(self.env)
        self.settings = Settings.from_env(self.env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_dir = self.settings.data_dir / "logs"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def queues(self) -> list[str]:
        return sorted({c.queue_name for c in load_clusters(self.settings.clusters_file).values()})

    @property
    def token_path(self) -> Path:
        return self.settings.data_dir / "token"

    def migrate(self) -> None:
        # The API, worker and scheduler inherit umask 077: runs/, logs/ and broker/ and their files are the
        # operator's only (osutil.private); the data dir holds the database and the token.
        private_umask()
        private_dir(self.settings.data_dir)
        private_dir(self.settings.runs_dir)
        proc = subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"alembic upgrade head failed:\n{proc.stderr[-3000:]}")

    def _spawn(self, name: str, args: list[str]) -> None:
        private_dir(self.log_dir)
        self.commands[name] = args
        with (self.log_dir / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=procs.set_parent_death_signal,
            )
        self.started_at[name] = time.monotonic()
        log.info("started %s (pid %d), log %s", name, self.procs[name].pid, self.log_dir / f"{name}.log")

    def start(self, ready_timeout_s: float = 60.0) -> None:
        try:
            load_clusters(self.settings.clusters_file)  # the worker's queues; the API reads it too
        except (ValueError, OSError) as exc:
            raise RuntimeError(f"SCALEBENCH_CLUSTERS_FILE: {exc}") from None
        if problem := port_problem(self.host, self.port):
            raise RuntimeError(problem)
        self.migrate()
        if self.with_token and not self.token_path.is_file():
            self.fresh_token = self.create_token()
        py = sys.executable
        self._spawn(
            "api",
            [
                py,
                "-m",
                "uvicorn",
                "api.app:create_app",
                "--factory",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
        )
        if self.with_worker:
            # --pool solo: the run executes in the worker process itself, so a SIGKILLed worker takes its
            # torchrun down (PDEATHSIG); one run at a time per node.
            self._spawn(
                "worker",
                [
                    py,
                    "-m",
                    "celery",
                    "-A",
                    "worker.main:app",
                    "worker",
                    "-n",
                    "scalebench@%h",
                    "-Q",
                    ",".join(self.queues),
                    "--pool",
                    "solo",
                    "--concurrency",
                    "1",
                    "--prefetch-multiplier",
                    "1",
                    "--loglevel",
                    "INFO",
                ],
            )
        # reaper (expired leases, finished run dirs, re-publishing) + the nightly suites, one process
        self._spawn("scheduler", [py, "-m", "worker.scheduler", "--reap-interval-s", str(self.reaper_interval_s)])
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Until our API answers /healthz: an answer from another process holding the port does not count."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    self._check_listener()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(
            f"the API did not answer on {self.url}/healthz within {timeout_s:.0f} s (see {self.log_dir / 'api.log'})"
        )

    def _check_listener(self) -> None:
        holders = procs.tcp_listener_pids(self.port)
        if holders and self.procs["api"].pid not in holders:  # empty: not visible here, trust the answer
            others = ", ".join(procs.describe(pid) for pid in holders)
            raise RuntimeError(f"port {self.port} is held by {others}, not by our API (pid {self.procs['api'].pid})")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; its log ends with:\n{self._tail(name)}")

    def _tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]

    def supervise(self) -> None:
        """One look at the children: a dead one is restarted after its back-off. RuntimeError when one died
        MAX_QUICK_DEATHS times in a row, each soon after its start (it would only die again)."""
        now = time.monotonic()
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            if name not in self.restart_at:
                self._schedule_restart(name, proc, now)
            elif now >= self.restart_at[name]:
                if name == "api" and (problem := port_problem(self.host, self.port)):
                    self.restart_at[name] = now + RESTART_BACKOFF_S[-1]
                    log.error("api: not restarted yet: %s", problem)
                    continue
                del self.restart_at[name]
                self.restarts[name] = self.restarts.get(name, 0) + 1
                self._spawn(name, self.commands[name])
                log.warning("%s restarted (restart %d)", name, self.restarts[name])

    def _schedule_restart(self, name: str, proc: subprocess.Popen, now: float) -> None:
        ran_s = now - self.started_at[name]
        deaths = self.quick_deaths.get(name, 0) + 1 if ran_s < STABLE_S else 0
        self.quick_deaths[name] = deaths
        _end_group(proc.pid)  # whatever it left in its process group
        if deaths >= MAX_QUICK_DEATHS:
            raise RuntimeError(
                f"{name} exited with code {proc.returncode} {deaths} times in a row, each within "
                f"{STABLE_S:.0f} s of its start; its log ends with:\n{self._tail(name)}"
            )
        delay_s = RESTART_BACKOFF_S[min(deaths, len(RESTART_BACKOFF_S) - 1)]
        self.restart_at[name] = now + delay_s
        log.error(
            "%s (pid %d) exited with code %s after %.1f s; restarting it in %.0f s (log %s)",
            name,
            proc.pid,
            proc.returncode,
            ran_s,
            delay_s,
            self.log_dir / f"{name}.log",
        )

    def create_token(self, name: str = "scalebench-up") -> str:
        """A fresh API token, also saved (0600) as <data dir>/token for the CLI."""
        token = create_local_token(name, env=self.env)
        partial = self.token_path.with_name(f".{self.token_path.name}.{os.getpid()}")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.replace(partial, self.token_path)  # a reader sees the old file or the whole new one, never a part
        return token

    def ensure_token(self, name: str = "scalebench-up") -> tuple[str, bool]:
        """(token, reused): the token saved in <data dir>/token when the API still accepts it, else a new one."""
        saved = self.token_path.read_text().strip() if self.token_path.is_file() else ""
        if saved and token_is_accepted(self.url, saved):
            return saved, saved != self.fresh_token
        return self.create_token(name), False

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every child at once, SIGKILL (the process group) after the grace; then sweep what is left:
        each child's process group and any process of a run under the runs dir (torchrun and its ranks)."""
        self.restart_at.clear()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s: SIGKILL", name, grace_s)
                procs.signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            _end_group(proc.pid)
        left = procs.pids_with_arg_like(str(self.settings.runs_dir) + os.sep, f"{os.sep}spec.json")
        if left:
            log.warning("run processes left after the stop: %s: ending them", ", ".join(map(procs.describe, left)))
            procs.signal_pids(left, signal.SIGKILL)
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


def _end_group(pgid: int) -> None:
    """SIGKILL what is left in a dead child's process group (its leader is gone; members may not be)."""
    procs.signal_group(pgid, signal.SIGKILL)


class _Stop(Exception):
    """SIGTERM: leave the supervision loop at once (not at its next tick)."""


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop


def serve_forever(stack: Stack, tick_s: float = 0.5) -> int:
    """Supervise until Ctrl-C / SIGTERM (exit 0) or a child that keeps dying (exit 1)."""
    signal.signal(signal.SIGTERM, _raise_stop)
    try:
        while True:
            stack.supervise()
            time.sleep(tick_s)
    except (KeyboardInterrupt, _Stop):
        pass
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    finally:  # stopping now: a second SIGTERM must not cut the stop short
        signal.signal(signal.SIGTERM, lambda *_: None)
    return 0
