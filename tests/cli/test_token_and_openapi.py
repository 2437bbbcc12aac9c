"""`scalebench token create` on the configured database (a relative data dir is the cwd's; no schema: one error
line), and the OpenAPI document's descriptions/example."""

from __future__ import annotations

import shutil

import sqlalchemy as sa
from typer.testing import CliRunner

from api.app import create_app
from cli.main import app as cli
from cli.stack import REPO_ROOT
from db.models import ApiToken
from db.session import make_engine
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


def _no_database_env(monkeypatch) -> None:
    for key in ("DATABASE_URL", "SCALEBENCH_DATABASE_URL", "SCALEBENCH_RUNS_DIR"):
        monkeypatch.delenv(key, raising=False)


def test_token_create_reads_a_relative_data_dir_from_the_cwd(sqlite_url, tmp_path, monkeypatch):
    _no_database_env(monkeypatch)
    cwd = tmp_path / "elsewhere"
    (cwd / "sbdata").mkdir(parents=True)
    shutil.move(sqlite_url.removeprefix("sqlite:///"), cwd / "sbdata" / "scalebench.db")  # migrated
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SCALEBENCH_DATA_DIR", "sbdata")
    result = CliRunner().invoke(cli, ["token", "create", "--name", "from-elsewhere"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    engine = make_engine(f"sqlite:///{cwd / 'sbdata' / 'scalebench.db'}")
    try:
        with engine.connect() as conn:
            hashes = conn.scalars(sa.select(ApiToken.token_hash).where(ApiToken.name == "from-elsewhere")).all()
    finally:
        engine.dispose()
    assert hashes == [hash_token(token)]
    assert not (REPO_ROOT / "sbdata").exists()


def test_token_create_without_a_schema_is_one_error_line(tmp_path, monkeypatch):
    _no_database_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCALEBENCH_DATA_DIR", "sbdata")
    db_file = tmp_path / "sbdata" / "scalebench.db"
    expected = (
        f"error: the database sqlite:///{db_file} has no scalebench tables yet: run `scalebench up` once with the "
        "same SCALEBENCH_DATA_DIR / SCALEBENCH_DATABASE_URL (it migrates the database), or "
        f"`alembic -c {REPO_ROOT / 'alembic.ini'} upgrade head`\n"
    )
    missing = CliRunner().invoke(cli, ["token", "create"])
    assert (missing.exit_code, missing.stderr) == (1, expected)
    assert not (tmp_path / "sbdata").exists() and not (REPO_ROOT / "sbdata").exists()  # nothing created
    db_file.parent.mkdir()
    db_file.write_bytes(b"")  # a database file without tables: db.admin's "no such table"
    empty = CliRunner().invoke(cli, ["token", "create"])
    assert (empty.exit_code, empty.stderr) == (1, expected)


def test_token_create_on_postgres_without_the_tables_is_one_error_line(pg_url, monkeypatch):
    # a search_path naming no schema: the database answers `relation "api_tokens" does not exist`
    monkeypatch.setenv("SCALEBENCH_DATABASE_URL", f"{pg_url}?options=-csearch_path%3Dno_such_schema")
    result = CliRunner().invoke(cli, ["token", "create"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith("error: the database ") and result.stderr.count("\n") == 1
    assert "has no scalebench tables yet: run `scalebench up` once" in result.stderr
