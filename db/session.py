"""Engines and session factories. Sessions are owned by the edge (a request, a task) which commits."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from core.contracts.specs import storable

SQLITE_BUSY_TIMEOUT_MS = 10_000
PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600  # the database holds webhook secrets and token hashes


def _json_serializer(value: Any) -> str:
    """JSON columns hold strict JSON on every dialect: a non-finite float is stored as null (SQLite's JSON
    functions and PostgreSQL's jsonb refuse Infinity and NaN), a lone surrogate as U+FFFD, NUL dropped
    (jsonb refuses \\u0000). The common case, nothing to repair, costs one json.dumps."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate raises here
        if "\\u0000" not in text:
            return text
    except ValueError:  # UnicodeEncodeError is one
        pass
    return json.dumps(storable(value), allow_nan=False, ensure_ascii=False)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers do not block the writer; foreign keys are off by default in SQLite.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An engine for PostgreSQL (pre-ping) or SQLite (WAL, foreign keys, busy timeout; parent dir created)."""
    parsed = make_url(url)
    kwargs.setdefault("json_serializer", _json_serializer)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
            _private_sqlite_file(Path(parsed.database))
        engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    return sa.create_engine(url, **kwargs)


def _private_sqlite_file(path: Path) -> None:
    """Create the database's directory (0700) and file (0600) private; an existing file is made private too
    (SQLite gives its -wal and -shm files the database file's mode). An existing directory is left as it is:
    it may be the user's own."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
        os.chmod(path.parent, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    fd = os.open(path, os.O_CREAT | os.O_RDWR, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def make_session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: objects read before a commit stay usable for the response after it.
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


def rowcount(result: sa.Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched: Session.execute is typed to return a Result, and DML gives its
    CursorResult subclass."""
    assert isinstance(result, sa.CursorResult), type(result)
    return result.rowcount


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work for an edge without a framework (a task, a CLI command): commit or roll back."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
