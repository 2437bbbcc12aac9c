"""Shared fixtures: the real PostgreSQL and Redis of this machine (no mocks). Reuse them from any tests/.

Services: TEST_DATABASE_URL (default postgresql+psycopg://root@127.0.0.1:5432/scalebench_test, a database
built by `make testdb` = `alembic upgrade head`) and TEST_REDIS_URL (default redis://127.0.0.1:6379/15).
Under pytest-xdist (`make test`: TEST_WORKERS processes) worker N > 0 uses `<database>_<N>` and Redis
database 15 - N instead (for_worker), so the processes never share a table or a queue.

Fixtures
  pg_url               the test database URL (session)
  pg_engine            one engine on it (session)
  pg_session_factory   a sessionmaker; every table is TRUNCATEd (RESTART IDENTITY CASCADE) after the test
  db_session           a Session from pg_session_factory (closed after the test; commit it yourself)
  sqlite_url           a fresh SQLite file under tmp_path, upgraded with `alembic upgrade head`
  redis_url            the test Redis URL; redis_client: a redis.Redis on it, FLUSHDB before and after
  celery_app           worker.queue.make_celery on the test Redis (publishes for real)
  test_settings        core.settings.Settings on the test Postgres + Redis, data under tmp_path
  api_token            a plain API token stored (hashed) in the test database
  make_client          make_client(settings=None, token=True) -> TestClient
                       with the lifespan entered (closed after the test)
  client / anon_client a TestClient sending `Authorization: Bearer <api_token>` / sending none
  queued_messages      queued_messages(queue="local-cpu") -> [(task name, args)] of the messages on the
                       Redis list of that queue (kombu's JSON envelope decoded)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from core.settings import Settings
from db.session import make_engine, make_session_factory, session_scope
from db.tables import Base

REPO = Path(__file__).resolve().parents[1]


def worker_index() -> int:
    """0 without pytest-xdist, else N of its worker gwN (`make test` runs the suite in TEST_WORKERS processes)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def for_worker(database_url: str, redis_url: str, index: int) -> tuple[str, str]:
    """Worker N > 0 gets its own database (`<name>_<N>`, built by `make testdb`) and the Redis database N below
    the given one, so that one worker's TRUNCATE or FLUSHDB never touches another's."""
    if index == 0:
        return database_url, redis_url
    db_url = sa.engine.make_url(database_url)
    db_url = db_url.set(database=f"{db_url.database}_{index}").render_as_string(hide_password=False)
    redis_base, _, redis_db = redis_url.rpartition("/")
    return db_url, f"{redis_base}/{int(redis_db or 0) - index}"


TEST_DATABASE_URL, TEST_REDIS_URL = for_worker(
    os.environ.get("TEST_DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:5432/scalebench_test"),
    os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
    worker_index(),
)


if "PYTEST_XDIST_WORKER" in os.environ:
    # Several pytest processes on a 2-core machine: torch's intra-op threads (the in-process runner tests, and the
    # processes the tests start, which inherit this) would only contend with the other workers'.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Modules with slow tests first (a stable sort, each module's order kept): under pytest-xdist the long
    modules start at once and the short ones fill in behind them."""
    slow_modules = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow_modules)


def pytest_xdist_make_scheduler(config, log):
    """`make test` under pytest-xdist: a module's tests stay on one worker (its module-scoped fixtures, such as
    tests/runner/test_breakdown.py's three runs, are built once), and so do all of tests/slurm (one Slurm
    cluster: two workers' jobs would queue behind each other)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/slurm" if path.startswith("tests/slurm/") else path

    config.option.loadscopereorder = False  # xdist would start the modules with most tests first; keep ours
    return ByModule(config, log)


@pytest.fixture(scope="session")
def pg_url() -> str:
    return TEST_DATABASE_URL


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1 FROM experiments LIMIT 1"))
    except sa.exc.SQLAlchemyError as exc:
        pytest.fail(f"test database {pg_url} is not reachable or not migrated (run `make testdb`): {exc}")
    yield engine
    engine.dispose()


def truncate_all(engine: sa.Engine) -> None:
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def pg_session_factory(pg_engine: sa.Engine) -> Iterator[sessionmaker[Session]]:
    yield make_session_factory(pg_engine)
    truncate_all(pg_engine)


@pytest.fixture
def db_session(pg_session_factory: sessionmaker[Session]) -> Iterator[Session]:
    with pg_session_factory() as session:
        yield session


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from alembic import command
    from alembic.config import Config

    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes["url"] = f"sqlite:///{path}"
    cfg.attributes["configure_logger"] = False
    command.upgrade(cfg, "head")
    return path


@pytest.fixture
def sqlite_url(_sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "scalebench.db"
    shutil.copy(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def redis_url() -> str:
    return TEST_REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def queued_messages(redis_client: redis.Redis) -> Callable[[str], list[tuple[str, list]]]:
    def read(queue: str = "local-cpu") -> list[tuple[str, list]]:
        out = []
        for raw in redis_client.lrange(queue, 0, -1):
            envelope = json.loads(raw)
            args, _kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
            out.append((envelope["headers"]["task"], args))
        return out

    return read


@pytest.fixture
def test_settings(tmp_path: Path, pg_url: str, redis_url: str) -> Settings:
    return Settings(data_dir=tmp_path, database_url=pg_url, broker_url=redis_url, runs_dir=tmp_path / "runs")


@pytest.fixture
def celery_app(test_settings: Settings, redis_client: redis.Redis):
    from worker.queue import make_celery

    app = make_celery(test_settings)
    yield app
    app.close()


@pytest.fixture
def api_token(pg_session_factory: sessionmaker[Session]) -> str:
    from db.tokens import create_token

    with session_scope(pg_session_factory) as session:
        token, _ = create_token(session, "tests", role="admin")  # the operator's, as `scalebench up` makes it
    return token


@pytest.fixture
def make_client(test_settings: Settings, api_token: str, redis_client: redis.Redis):
    from fastapi.testclient import TestClient

    from api.app import create_app

    clients: list[TestClient] = []

    def make(settings: Settings | None = None, token: bool = True) -> TestClient:
        app = create_app(settings or test_settings)
        headers = {"Authorization": f"Bearer {api_token}"} if token else {}
        client = TestClient(app, headers=headers, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client):
    return make_client()


@pytest.fixture
def anon_client(make_client):
    return make_client(token=False)
