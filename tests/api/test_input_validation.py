"""The API edge against bad input (real Postgres and Redis; SQLite where the embedded stack differs):
extreme floats and unstorable text refused with a field-named 422, bad stored values degraded to flagged
points (never a 5xx, never a 503 for a data error), secrets kept out of reads, tokens listed and revoked,
body size / Content-Type / auth checked before the body is parsed, strict types, and the write rate limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time

import pytest
import sqlalchemy as sa

import db.runs
from api.app import create_app
from api.guard import RateLimiter
from api.problems import is_unavailable
from core.settings import Settings
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token
from tests.db.helpers import add_experiment, succeeded_result

BASE = {"name": "imp", "model": "debug", "cluster": "local-cpu", "scaling": "weak", "seq_len": 256}
POINT = {"num_devices": 1, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0}
SPEC = {"name": "s", "model": "debug", "gpu_counts": [1, 2], "precisions": ["bf16"], "steps": 4, "warmup_steps": 1}


def _post_raw(client, path: str, body: dict, **headers: str):
    """json.dumps escapes lone surrogates and NUL (\\ud800, \\u0000): the server decodes them back."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json", **headers})


def _fields(r) -> dict[str, dict]:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return {e["field"]: e for e in r.json()["errors"]}


@pytest.fixture
def sqlite_client(make_client, test_settings, sqlite_url, tmp_path):
    """A client on a migrated SQLite file (the embedded stack's store), with a token of its own."""
    settings = Settings(
        data_dir=tmp_path, database_url=sqlite_url, broker_url=test_settings.broker_url, runs_dir=tmp_path / "runs"
    )
    engine = make_engine(sqlite_url)
    with session_scope(make_session_factory(engine)) as s:
        token, _ = create_token(s, "sqlite")
    engine.dispose()
    client = make_client(settings)
    client.headers["Authorization"] = f"Bearer {token}"
    return client


# ------------------------------------------------------------------------------ 1. finite values, derived too


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
@pytest.mark.parametrize(
    ("field", "value"), [("tokens_per_sec", 1e308), ("tokens_per_sec", 5e-324), ("tokens_per_sec_per_device", 1e308)]
)
def test_import_refuses_throughput_whose_derived_values_overflow(request, backend, field, value) -> None:
    client = request.getfixturevalue("client" if backend == "postgresql" else "sqlite_client")
    point = {k: v for k, v in POINT.items() if k != "tokens_per_sec"} | {field: value}
    r = client.post("/experiments/import", json=BASE | {"points": [point, point | {"num_devices": 2}]})
    assert r.status_code == 422, r.text
    errors = _fields(r)
    assert f"points[0].{field}" in errors and "finite" in errors[f"points[0].{field}"]["message"]
    assert client.get("/experiments").json()["items"] == []  # nothing stored


def test_import_at_the_edge_of_the_float_range_reads_back(client) -> None:
    """Large and small but representable values are accepted, and every read of them answers 200."""
    points = [
        POINT | {"num_devices": n, "tokens_per_sec": 1e290 * n, "loss_curve": [1e308, -1e308, 5e-324]} for n in (1, 2)
    ]
    exp = client.post("/experiments/import", json=BASE | {"points": points}).json()
    for path in (
        f"/experiments/{exp['id']}/scaling",
        f"/experiments/{exp['id']}/scaling?format=csv",
        f"/experiments/{exp['id']}/scaling.png",
        f"/experiments/{exp['id']}/losses",
        f"/runs/{exp['runs'][0]['id']}",
    ):
        assert client.get(path).status_code == 200, path


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_bad_values_in_the_store_degrade_to_flagged_points(request, backend, make_client) -> None:
    """A summary holding inf/NaN (and, on SQLite, a result JSON holding Infinity, as written before JSON columns
    were strict) reads as a flagged point: scaling JSON/CSV/PNG, compare, losses and the run all answer 200."""
    client = request.getfixturevalue("client" if backend == "postgresql" else "sqlite_client")
    ids = []
    for name in ("a", "b"):
        r = client.post(
            "/experiments/import",
            json=BASE
            | {
                "name": name,
                "points": [POINT | {"loss_curve": [3.0, 2.0]}, POINT | {"num_devices": 2, "loss_curve": [3.0, 2.5]}],
            },
        )
        assert r.status_code == 201, r.text
        ids.append(r.json())
    bad_run = ids[0]["runs"][0]["id"]
    engine = client.app.state.engine
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE run_summaries SET tokens_per_sec = :inf, tflops_per_device = :nan, "
                "mfu_vs_bf16_peak = :inf WHERE run_id = :id"
            ),
            {"inf": float("inf"), "id": bad_run, "nan": float("nan") if backend == "postgresql" else float("-inf")},
        )  # SQLite: NaN is NULL
        if backend == "sqlite":
            conn.execute(
                sa.text("UPDATE runs SET result = :r WHERE id = :id"),
                {"r": '{"numerics": {"final_loss": Infinity}, "environment": {"hosts": [NaN]}}', "id": bad_run},
            )
    exp_id = ids[0]["id"]
    for path in (
        f"/experiments/{exp_id}/scaling",
        f"/experiments/{exp_id}/scaling?format=csv",
        f"/experiments/{exp_id}/scaling.png",
        f"/experiments/{exp_id}/losses",
        f"/compare?experiments={exp_id},{ids[1]['id']}",
        f"/runs/{bad_run}",
        f"/experiments/{exp_id}/runs",
    ):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    point = client.get(f"/experiments/{exp_id}/scaling").json()["series"][0]["points"][0]
    assert point["num_devices"] == 1 and "invalid_value" in point["flags"] and point["status"] == "failed"
    assert client.get(f"/runs/{bad_run}").json()["summary"]["tokens_per_sec"] is None


def test_a_data_error_is_not_an_outage(tmp_path) -> None:
    """OperationalError: "malformed JSON" is the data's fault (not 503); a locked or absent database is an outage."""
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(sa.exc.OperationalError) as data_error, engine.connect() as conn:
        conn.execute(sa.text("SELECT json_extract('{\"a\": Infinity}', '$.a')"))
    assert not is_unavailable(data_error.value)
    down = make_engine("postgresql+psycopg://root@127.0.0.1:1/none", pool_pre_ping=False)
    with pytest.raises(sa.exc.OperationalError) as outage, down.connect():
        pass
    assert is_unavailable(outage.value)
    engine.dispose()
    down.dispose()


# -------------------------------------------------------------------------------- 2. storable text everywhere


def test_unstorable_text_is_refused_with_its_field(client) -> None:
    cases = {
        "name": BASE | {"name": "a\x00b", "points": [POINT]},
        "tags[0]": BASE | {"tags": ["\ud800"], "points": [POINT]},
        "points[0].environment.torch_version": BASE
        | {"points": [POINT | {"environment": {"torch_version": "\ud800"}}]},
        "points[0].environment.hosts[1]": BASE | {"points": [POINT | {"environment": {"hosts": ["a", "b\x00"]}}]},
        "device_name": BASE | {"cluster": "elsewhere", "vendor": "nvidia", "device_name": "H\udfff", "points": [POINT]},
    }
    for field, body in cases.items():
        r = _post_raw(client, "/experiments/import", body)
        assert r.status_code == 422, (field, r.text)
        assert field in _fields(r), (field, r.json()["errors"])
    for field, spec in {
        "name": SPEC | {"name": "x\ud800"},
        "tags[0]": SPEC | {"tags": ["a\x00"]},
        "data_path": SPEC | {"data_path": "/d\x00"},
    }.items():
        r = _post_raw(client, "/experiments", spec)
        assert r.status_code == 422 and field in _fields(r), (field, r.text)
    assert client.get("/experiments").json()["items"] == []


def test_non_finite_import_values_are_refused(client) -> None:
    for field, point in {
        "points[0].loss_curve[1]": POINT | {"loss_curve": [1.0, "Infinity"]},
        "points[0].final_loss": POINT | {"final_loss": "NaN"},
    }.items():
        raw = json.dumps(BASE | {"points": [point]}).replace('"Infinity"', "Infinity").replace('"NaN"', "NaN")
        r = client.post("/experiments/import", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and field in _fields(r), (field, r.text)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_a_non_finite_query_float_says_finite_and_names_the_parameter(client, value) -> None:
    r = client.get(f"/experiments/1/plan?tokens=1T&max_gpus=8&gpu_hour_cost={value}")
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"] == [
        {"field": "query.gpu_hour_cost", "message": f"must be a finite number, not {value!r}", "allowed": None}
    ]
    r = client.get("/experiments/1/plan?tokens=1T&max_gpus=8&gpu_hour_cost=2e6")  # finite: the bound it passed
    assert r.json()["errors"][0]["message"] == "Input should be less than or equal to 1000000"


# ------------------------------------------------------------------------------------------------- 5. types


def test_gpu_counts_are_integers_not_booleans_or_strings(client) -> None:
    for bad in ([True], ["1"], [1.0]):
        r = client.post("/experiments", json=SPEC | {"gpu_counts": bad})
        assert r.status_code == 422 and "gpu_counts[0]" in _fields(r), (bad, r.text)
    r = client.post("/experiments/import", json=BASE | {"points": [POINT | {"num_devices": True}]})
    assert r.status_code == 422 and "points[0].num_devices" in _fields(r), r.text


def test_cross_field_errors_name_their_field(client) -> None:
    cases = {
        "warmup_steps": SPEC | {"steps": 5, "warmup_steps": 5},
        "global_batch_size": SPEC | {"scaling": "strong"},
        "local_batch_size": SPEC | {"scaling": "strong", "global_batch_size": 8, "local_batch_size": 2},
        "precompute_fp8_scales": SPEC | {"precompute_fp8_scales": True},
    }
    for field, spec in cases.items():
        r = client.post("/experiments", json=spec)
        assert r.status_code == 422, r.text
        assert list(_fields(r)) == [field], (field, r.json()["errors"])


# ---------------------------------------------------------------------------------------------- 4. secrets


def test_webhook_urls_and_secrets_are_never_returned(client, anon_client) -> None:
    with_credentials = client.post("/webhooks", json={"url": "https://bot:pa55@hooks.example.com/x"})
    assert with_credentials.status_code == 422 and list(_fields(with_credentials)) == ["url"]
    url = "https://hooks.example.com:8443/services/T0/B0/XYZSECRET?token=abc123"
    r = client.post("/webhooks", json={"url": url, "secret": "s" * 32})
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["url"], created["host"], created["secret"]) == (
        "https://hooks.example.com:8443/***",
        "hooks.example.com",
        "s" * 32,
    )
    assert anon_client.get("/webhooks").status_code == 401  # webhooks are read with a token only
    listed = client.get("/webhooks")
    assert listed.status_code == 200
    assert listed.json()[0]["host"] == "hooks.example.com"
    for secret in ("XYZSECRET", "abc123", "s" * 32):
        assert secret not in listed.text


def test_anonymous_run_reads_hide_worker_host_and_run_dir(client, anon_client, pg_session_factory, tmp_path):
    with session_scope(pg_session_factory) as s:
        exp_id, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "celery@node-1:4242", "node-1", 30)
        db.runs.update_launch(s, ids[0], run_dir=str(tmp_path))
        result = succeeded_result().model_dump(mode="json") | {
            "environment": {
                "vendor": "cpu",
                "device_name": "cpu",
                "device_count": 1,
                "torch_version": "2",
                "world_size": 1,
                "hosts": ["node-1"],
            }
        }
        db.runs.record_result(s, ids[0], type(succeeded_result()).model_validate(result))
    anon = anon_client.get(f"/runs/{ids[0]}").json()
    assert (anon["worker"], anon["host"], anon["run_dir"]) == (None, None, None)
    assert anon["result"]["environment"]["hosts"] == [] and "node-1" not in json.dumps(anon)
    listed = anon_client.get(f"/experiments/{exp_id}/runs").json()["items"][0]
    assert (listed["worker"], listed["host"]) == (None, None)
    authed = client.get(f"/runs/{ids[0]}").json()
    assert (authed["worker"], authed["host"], authed["run_dir"]) == ("celery@node-1:4242", "node-1", str(tmp_path))
    assert client.get(f"/experiments/{exp_id}/runs").json()["items"][0]["host"] == "node-1"


def test_sqlite_database_and_its_directory_are_created_private(tmp_path) -> None:
    path = tmp_path / "data" / "scalebench.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
        conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in path.parent.iterdir()}
    engine.dispose()
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert modes["scalebench.db"] == 0o600 and modes.get("scalebench.db-wal", 0o600) == 0o600, modes
    path.chmod(0o644)  # a database made before: tightened when opened
    make_engine(f"sqlite:///{path}").dispose()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_tokens_are_listed_created_and_revoked_over_http(client, anon_client, api_token) -> None:
    assert anon_client.get("/tokens").status_code == 401
    r = client.post("/tokens", json={"name": "ci"})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["token"].startswith(created["prefix"]) and len(created["prefix"]) < len(created["token"]) / 3
    listed = client.get("/tokens")
    assert listed.status_code == 200
    assert [t["name"] for t in listed.json()] == ["tests", "ci"]
    assert created["token"] not in listed.text and "hash" not in listed.text
    assert set(listed.json()[1]) == {"id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "role"}
    ci = {"Authorization": f"Bearer {created['token']}"}
    assert anon_client.post("/experiments/1/cancel", headers=ci).status_code == 404  # valid: reaches the route
    revoked = client.delete(f"/tokens/{created['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    r = anon_client.post("/experiments/1/cancel", headers=ci)
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
    assert [t["name"] for t in client.get("/tokens").json()] == ["tests"]
    again = client.delete(f"/tokens/{created['id']}")  # idempotent: still revoked, at the same time
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    assert client.delete("/tokens/999999").status_code == 404


def test_cli_token_list_and_revoke(test_settings, api_token, pg_session_factory, monkeypatch) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from tests.live_server import live_server

    with session_scope(pg_session_factory) as s:
        _, other = create_token(s, "laptop")
    monkeypatch.setenv("SCALEBENCH_TOKEN", api_token)
    runner = CliRunner()
    with live_server(test_settings) as url:
        listed = runner.invoke(app, ["token", "list", "--server", url])
        assert listed.exit_code == 0, listed.output
        assert "laptop" in listed.output and other.prefix in listed.output and api_token not in listed.output
        assert "never" in listed.output  # the laptop token was never used
        revoked = runner.invoke(app, ["token", "revoke", str(other.id), "--server", url])
        assert revoked.exit_code == 0 and f"token {other.id} (laptop) is revoked, since " in revoked.output, (
            revoked.output
        )
        assert "laptop" not in runner.invoke(app, ["token", "list", "--server", url]).output
        again = runner.invoke(app, ["token", "revoke", str(other.id), "--server", url])  # still revoked, said so
        assert again.exit_code == 0 and revoked.output == again.output, again.output
        unknown = runner.invoke(app, ["token", "revoke", "999999", "--server", url])
        assert unknown.exit_code == 1 and "404" in unknown.output


# ------------------------------------------------------------------- 3. body size, Content-Type, auth first


async def _asgi_post(app, path: str, chunks, headers: list[tuple[bytes, bytes]]) -> tuple[int, int, dict]:
    """POST through the ASGI app with a body streamed chunk by chunk; (status, bytes the app read, problem)."""
    read, sent = 0, []
    source = iter(chunks)

    async def receive():
        nonlocal read
        chunk = next(source, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, read, json.loads(body)


def _stream(num_mib: int = 80):
    """A large body in 1 MiB chunks (finite: a server that reads it all only wastes memory and time)."""
    for _ in range(num_mib):
        yield b"x" * (1 << 20)


def test_body_limit_is_413_before_the_body_is_read_or_parsed(test_settings, api_token, redis_client) -> None:
    from fastapi.testclient import TestClient

    app = create_app(test_settings)  # default limits: 4 MiB, 64 MiB for import
    with TestClient(app):
        auth = [(b"authorization", f"Bearer {api_token}".encode()), (b"content-type", b"application/json")]
        # Declared too large: refused before a byte is read.
        status, read, problem = asyncio.run(
            _asgi_post(app, "/experiments", _stream(), auth + [(b"content-length", b"50000000")])
        )
        assert (status, read, problem["status"]) == (413, 0, 413) and "4194304" in problem["detail"]
        # Streamed without a length (chunked): counted, refused once past the limit, the rest never read.
        status, read, problem = asyncio.run(
            _asgi_post(app, "/experiments", _stream(), auth + [(b"transfer-encoding", b"chunked")])
        )
        assert status == 413 and read <= test_settings.max_body_bytes + (1 << 20)
        assert (
            problem["detail"]
            == "the request body (chunked) went past the limit and was cut off there; the limit is 4194304 bytes"
        )
        # Import has the larger limit: 5 MiB is parsed (and refused as bad JSON, not as too large).
        status, read, problem = asyncio.run(
            _asgi_post(
                app,
                "/experiments/import",
                iter([b"x" * (5 << 20)]),
                auth + [(b"content-length", str(5 << 20).encode())],
            )
        )
        assert status == 422 and read == 5 << 20
        # No token: 401 before the body is read (an unauthenticated 50 MB POST costs nothing).
        status, read, problem = asyncio.run(
            _asgi_post(
                app,
                "/experiments/import",
                _stream(),
                [(b"content-type", b"application/json"), (b"content-length", b"50000000")],
            )
        )
        assert (status, read) == (401, 0) and problem["errors"][0]["field"] == "header.Authorization"


def test_limits_come_from_settings(make_client, test_settings) -> None:
    client = make_client(Settings(**{**test_settings.__dict__, "max_body_bytes": 300}))
    r = client.post("/experiments", json=SPEC | {"tags": ["x" * 60] * 5})
    assert r.status_code == 413 and r.headers["content-type"].startswith("application/problem+json")
    assert client.post("/experiments", json=SPEC).status_code in (201, 422)


def test_invalid_json_without_a_token_is_401(anon_client) -> None:
    for path in ("/experiments", "/experiments/import", "/webhooks", "/suites", "/tokens"):
        r = anon_client.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 401, (path, r.text)


def test_wrong_or_missing_content_type_is_415(client) -> None:
    body = json.dumps(SPEC).encode()
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}, {}):
        r = client.post("/experiments", content=body, headers=headers)
        assert r.status_code == 415, (headers, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "application/json" in r.json()["detail"] and r.json()["errors"][0]["field"] == "header.Content-Type"
    ok = client.post("/experiments", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (json.dumps(SPEC)[:-1].encode() + b', "seed": ' + b"7" * 5000 + b"}", "an integer of more than 4300 digits"),
        (json.dumps(SPEC | {"name": "café"}, ensure_ascii=False).encode("latin-1"), "not UTF-8 text: byte 0xe9"),
        (b"[" * 100_000 + b"]" * 100_000, "arrays or objects nested too deeply"),
    ],
    ids=["huge-integer", "not-utf8", "deep-nesting"],
)
def test_a_body_the_json_parser_refuses_is_a_422_naming_the_body(client, body, reason) -> None:
    r = client.post("/experiments", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    [err] = r.json()["errors"]
    assert err["field"] == "body" and err["message"].startswith(f"not valid JSON: {reason}"), err
    assert r.json()["detail"] == f"invalid request: body: {err['message']}"
    assert client.get("/experiments").json()["items"] == []


# ------------------------------------------------------------------------------------------ 6. rate limit


def test_writes_are_rate_limited_per_token(make_client, test_settings, pg_session_factory) -> None:
    client = make_client(Settings(**{**test_settings.__dict__, "write_rate_per_min": 6, "write_burst": 2}))
    for _ in range(2):
        assert client.post("/experiments/1/cancel").status_code == 404
    r = client.post("/experiments/1/cancel")
    assert r.status_code == 429 and r.headers["content-type"].startswith("application/problem+json")
    assert 1 <= int(r.headers["retry-after"]) <= 10
    assert client.get("/experiments").status_code == 200  # reads are not limited
    with session_scope(pg_session_factory) as s:
        other, _ = create_token(s, "other")
    assert client.post("/experiments/1/cancel", headers={"Authorization": f"Bearer {other}"}).status_code == 404


def test_rate_limiter_refills_at_its_rate() -> None:
    limiter = RateLimiter(rate_per_min=60, burst=2)  # one write per second, two at once
    t = time.monotonic()
    assert [limiter.take(1, t) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take(1, t) == pytest.approx(1.0)
    assert limiter.take(2, t) == 0.0  # another token has its own bucket
    assert limiter.take(1, t + 1.0) == 0.0 and limiter.take(1, t + 1.0) > 0
