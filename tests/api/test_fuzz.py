"""Schema-driven fuzzing (schemathesis over the OpenAPI document): no body, header, query or path makes a
500 or a hang, and every error is application/problem+json. Valid and invalid inputs (positive and
negative modes); the real Postgres and Redis behind the app."""

from __future__ import annotations

import sys
import time

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=MAX_EXAMPLES, allow_x00=True, no_shrink=False
)


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


# ---------------------------------------------------------------- imports with extreme numbers, read back

FLOAT_EDGES = [sys.float_info.max, 1e308, 1e300, 1e155, 1e-160, 1e-300, sys.float_info.min, 5e-324]
extreme = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(min_value=5e-324, max_value=sys.float_info.max))
IMPORT_COUNTS = (1, 2, 4)
extreme_imports = st.lists(extreme, min_size=2 * len(IMPORT_COUNTS), max_size=2 * len(IMPORT_COUNTS)).map(
    lambda xs: {
        "name": "fuzz import",
        "model": "debug",
        "cluster": "local-cpu",
        "seq_len": 256,
        "points": [
            {"num_devices": n, "precision": p, "layout": "fsdp", "tokens_per_sec": x}
            for (p, n), x in zip([(p, n) for p in ("bf16", "fp8-tensorwise") for n in IMPORT_COUNTS], xs)
        ],
    }
)
QUERY_FILL = {"experiments": "{id},{id}", "tokens": "1e12", "max_gpus": "1024"}


def curve_reads(exp_id: int) -> list[str]:
    """Every GET of the OpenAPI document that reads one experiment's curves (and /compare), its required query
    parameters filled in; again with format=csv where it has one, and with full_size=65536 where it takes one."""
    paths = []
    for path, ops in APP.openapi()["paths"].items():
        op = ops.get("get")
        if op is None or not ("{experiment_id}" in path or path == "/compare"):
            continue
        params = {q["name"]: q for q in op.get("parameters", []) if q["in"] == "query"}
        query = "&".join(f"{name}={QUERY_FILL[name]}" for name, q in params.items() if q.get("required"))
        url = path.replace("{experiment_id}", "{id}") + (f"?{query}" if query else "")
        paths.append(url)
        sep = "&" if "?" in url else "?"
        paths += [f"{url}{sep}format=csv"] if "format" in params else []
        paths += [f"{url}{sep}full_size=65536"] if "full_size" in params else []
    return [p.format(id=exp_id) for p in paths]


@pytest.fixture
def import_token(live_app) -> str:
    """A token of its own: the schema fuzzer may have revoked live_app's (DELETE /tokens/{id})."""
    engine = make_engine(TEST_DATABASE_URL)
    with session_scope(make_session_factory(engine)) as s:
        token, _ = create_token(s, "fuzz imports")
    engine.dispose()
    return token


@given(body=extreme_imports)
@settings(
    deadline=None, suppress_health_check=list(HealthCheck), max_examples=MAX_EXAMPLES, derandomize=True, database=None
)
def test_extreme_imports_read_back_on_every_curve_endpoint(body, import_token):
    """Throughput from the subnormals to the float maximum at three GPU counts: the import answers 201 or 422,
    and every curve read of what it stored answers without a 5xx."""
    client = TestClient(APP, headers={"Authorization": f"Bearer {import_token}"})  # live_app entered the lifespan
    r = client.post("/experiments/import", json=body)
    assert r.status_code in (201, 422), r.text[:500]
    if r.status_code == 422:
        return
    for path in curve_reads(r.json()["id"]):
        got = client.get(path)
        assert got.status_code < 500, (path, got.text[:500])
