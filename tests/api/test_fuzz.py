"""Schema-driven fuzzing (schemathesis over the OpenAPI document): no body, header, query or path makes a
500 or a hang, and every error is application/problem+json. Valid and invalid inputs (positive and
negative modes); the real Postgres and Redis behind the app."""

from __future__ import annotations

import time

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from api.app import create_app
from core.settings import Settings
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token
from tests.conftest import TEST_DATABASE_URL, TEST_REDIS_URL, truncate_all

MAX_EXAMPLES = 40  # per operation and mode; ~30 s in all on 2 cores
MAX_RESPONSE_S = 5.0

_settings = Settings(database_url=TEST_DATABASE_URL, broker_url=TEST_REDIS_URL)
APP = create_app(_settings)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                max_examples=MAX_EXAMPLES, allow_x00=True, no_shrink=False)


@pytest.fixture(scope="module")
def live_app():
    """Enter the lifespan once (engine, celery, clusters on app.state) for schemathesis' own ASGI client."""
    engine = make_engine(TEST_DATABASE_URL)
    with session_scope(make_session_factory(engine)) as s:
        token, _ = create_token(s, "fuzz")
    with TestClient(APP):
        yield token
    truncate_all(engine)
    engine.dispose()


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=MAX_EXAMPLES, derandomize=True)
def test_no_server_error_for_any_input(case, live_app):
    # Authenticated when the generated case carries no Authorization header; generated values test 401s.
    headers = {} if "Authorization" in (case.headers or {}) else {"Authorization": f"Bearer {live_app}"}
    started = time.monotonic()
    response = case.call(headers=headers)
    elapsed = time.monotonic() - started
    assert response.status_code < 500, (case.as_curl_command(), response.text[:2000])
    assert elapsed < MAX_RESPONSE_S, case.as_curl_command()
    if response.status_code >= 400:
        assert response.headers["content-type"][0] == "application/problem+json", response.headers
        problem = response.json()
        assert problem["status"] == response.status_code and "title" in problem
