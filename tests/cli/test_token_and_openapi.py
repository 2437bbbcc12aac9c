"""`scalebench token create` on the configured database, and the OpenAPI document's descriptions/example."""

from __future__ import annotations

import sqlalchemy as sa
from typer.testing import CliRunner

from api.app import create_app
from cli.main import app as cli
from db.models import ApiToken
from db.tokens import hash_token


def test_token_create_prints_token_and_stores_only_its_hash(pg_url, pg_session_factory, anon_client, monkeypatch):
    monkeypatch.setenv("SCALEBENCH_DATABASE_URL", pg_url)
    result = CliRunner().invoke(cli, ["token", "create", "--name", "ci-bot"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("sb_") and len(token) > 40
    with pg_session_factory() as s:
        rows = s.scalars(sa.select(ApiToken).where(ApiToken.name == "ci-bot")).all()
    assert [r.token_hash for r in rows] == [hash_token(token)]
    r = anon_client.post(
        "/experiments",
        headers={"Authorization": f"Bearer {token}"},
        json={"name": "cli", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"]},
    )
    assert r.status_code == 201, r.text


def test_openapi_has_descriptions_example_and_problem_schema():
    doc = create_app().openapi()  # no lifespan needed: nothing is created at import or in the factory
    post = doc["paths"]["/experiments"]["post"]
    assert post["description"] and post["summary"]
    body = post["requestBody"]["content"]["application/json"]
    assert body["examples"]["llama3-8b"]["value"]["model"] == "8b"
    spec = doc["components"]["schemas"]["ExperimentSpec"]
    assert spec["properties"]["gpu_counts"]["description"] and spec["examples"][0]["gpu_counts"] == [8, 16, 32, 64]
    assert "application/problem+json" in post["responses"]["422"]["content"]
    assert {
        "/experiments/{experiment_id}",
        "/runs/{run_id}",
        "/runs/{run_id}/log",
        "/clusters",
        "/healthz",
        "/readyz",
        "/experiments/{experiment_id}/cancel",
        "/experiments/{experiment_id}/runs",
    } <= set(doc["paths"])


def test_cli_prints_api_timestamps_to_the_second_in_utc():
    from cli.runs import utc_time

    assert utc_time("2026-12-04T06:40:37.123456+00:00") == "2026-12-04 06:40:37"
    assert utc_time(None) == "-" and utc_time(None, "never") == "never" and utc_time("", "never") == "never"
