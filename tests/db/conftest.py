"""`factory`: a session factory on PostgreSQL and (parametrized) on a migrated SQLite file."""

from __future__ import annotations

import pytest

from db.session import make_engine, make_session_factory


@pytest.fixture(params=["postgresql", "sqlite"])
def factory(request):
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_session_factory")
        return
    engine = make_engine(request.getfixturevalue("sqlite_url"))
    yield make_session_factory(engine)
    engine.dispose()
