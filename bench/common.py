"""What the service benchmarks share: a fresh Postgres database built by the migrations, a uvicorn server
on a free loopback port, the whole embedded stack (`scalebench up`) for the GPU-node benchmarks, and the version
line every recorded result carries."""

from __future__ import annotations

import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql+psycopg://root@127.0.0.1:5432/postgres"
# uvicorn's supervisor restarts a worker that does not answer its ping within 5 s (the default); on this
# shared 2-core machine a busy worker can miss that, and a restart breaks the connections it held.
HEALTHCHECK = ["--timeout-worker-healthcheck", "60"]


def fresh_database(name: str) -> str:
    """Drop and create database `name`, run `alembic upgrade head` on it; its URL."""
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    url = f"postgresql+psycopg://root@127.0.0.1:5432/{name}"
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes.update(url=url, configure_logger=False)
    command.upgrade(cfg, "head")
    return url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_uvicorn(
    url: str,
    broker_url: str,
    clusters_file: str,
    port: int,
    workers: int,
    *,
    ready_path: str = "/healthz",
    timeout_s: float = 60.0,
) -> subprocess.Popen:
    """uvicorn serving the app factory on 127.0.0.1:port; returns once `ready_path` answers 200."""
    env = os.environ | {
        "SCALEBENCH_DATABASE_URL": url,
        "SCALEBENCH_BROKER_URL": broker_url,
        "SCALEBENCH_CLUSTERS_FILE": clusters_file,
        "PYTHONPATH": str(REPO),
    }
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "api.app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
        "--backlog",
        "2048",
        *HEALTHCHECK,
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    return wait_until_serving(proc, f"http://127.0.0.1:{port}{ready_path}", timeout_s, "uvicorn")


def wait_until_serving(proc: subprocess.Popen, url: str, timeout_s: float, what: str) -> subprocess.Popen:
    """Poll `url` until it answers 200 (returns proc), the process exits, or timeout_s passes (terminated)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def versions() -> str:
    import fastapi
    import psycopg
    import pydantic
    import uvicorn

    pg = sa.create_engine(PG_ADMIN)
    with pg.connect() as conn:
        pg_version = conn.execute(sa.text("SHOW server_version")).scalar()
    pg.dispose()
    return (
        f"python {platform.python_version()}, fastapi {fastapi.__version__}, pydantic {pydantic.__version__}, "
        f"uvicorn {uvicorn.__version__}, sqlalchemy {sa.__version__}, psycopg {psycopg.__version__}, "
        f"httpx {httpx.__version__}, postgresql {pg_version}"
    )


def start_stack(env: dict[str, str], port: int, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`scalebench up` on `port` with `env` (its own process group), once it answers /healthz and has written
    its token: (the process, the token)."""
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url, token_file = f"http://127.0.0.1:{port}", Path(env["SCALEBENCH_DATA_DIR"]) / "token"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"scalebench up exited:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200 and token_file.is_file():
                return proc, token_file.read_text().strip()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"scalebench up did not answer within 120 s:\n{log_path.read_text()[-3000:]}")


def stop_stack(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def median_ms(fn, repeats: int = 10, warmup: int = 3) -> float:
    """Median ms of fn() over `repeats` calls after `warmup` calls: CUDA events on a GPU, the wall clock on a CPU
    (a smoke run)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def markdown_head(title: str, command: str) -> list[str]:
    """A recorded result's first lines: its title, then the command that reproduces it."""
    return [f"# {title}", "", "```", command, "```", ""]
