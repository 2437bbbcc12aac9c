"""The queued-run cap of a suite holds under concurrent manual triggers, on PostgreSQL and SQLite: the check and
the firing are one transaction under the suite's row lock (db.suites.lock_suite)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from core.settings import Settings
from db.models import Run, SuiteFiring
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token

NUM_TRIGGERS = 10
SPEC = {"name": "race", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"], "steps": 4, "warmup_steps": 1}


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(request, make_client, test_settings, tmp_path):
    """(a client, a session factory) on one database; SQLite: a migrated file with a token of its own."""
    if request.param == "postgresql":
        yield make_client(), request.getfixturevalue("pg_session_factory")
        return
    url = request.getfixturevalue("sqlite_url")
    settings = Settings(data_dir=tmp_path, database_url=url, broker_url=test_settings.broker_url, runs_dir=tmp_path)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    with session_scope(factory) as s:
        token, _ = create_token(s, "sqlite")
    client = make_client(settings)
    client.headers["Authorization"] = f"Bearer {token}"
    yield client, factory
    engine.dispose()


def test_ten_concurrent_triggers_with_a_cap_of_one_fire_exactly_once(backend) -> None:
    client, factory = backend
    created = client.post("/suites", json={"name": "race", "spec": SPEC, "max_queued_runs": 1})
    assert created.status_code == 201, created.text
    suite_id = created.json()["id"]
    barrier = threading.Barrier(NUM_TRIGGERS)
    codes: list[int] = []

    def trigger() -> None:
        barrier.wait()
        codes.append(client.post(f"/suites/{suite_id}/trigger").status_code)

    threads = [threading.Thread(target=trigger) for _ in range(NUM_TRIGGERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201] + [409] * (NUM_TRIGGERS - 1), codes
    with factory() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Run)) == 1  # one firing's one run
        outcomes = s.execute(sa.select(SuiteFiring.outcome, sa.func.count()).group_by(SuiteFiring.outcome)).all()
        assert dict(outcomes) == {"fired": 1, "skipped": NUM_TRIGGERS - 1}


def test_concurrent_creates_of_one_name_give_one_suite_and_409s(backend) -> None:
    client, factory = backend
    barrier = threading.Barrier(NUM_TRIGGERS)
    answers: list[tuple[int, str]] = []

    def create() -> None:
        barrier.wait()
        r = client.post("/suites", json={"name": "same", "spec": SPEC})
        answers.append((r.status_code, r.json()["errors"][0]["field"] if r.status_code == 409 else ""))

    threads = [threading.Thread(target=create) for _ in range(NUM_TRIGGERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [(201, "")] + [(409, "name")] * (NUM_TRIGGERS - 1), answers
