"""Tokens with roles: `admin` (tokens, webhooks; the operator's first token and `scalebench up`'s) and `submit`
(experiments, suites, imports, regressions). A submit token revokes only itself, an admin any token;
Idempotency-Keys are per token (token B never gets token A's experiment back). Real Postgres, through HTTP."""

from __future__ import annotations

import pytest

from db.admin import create_token_on
from db.models import ApiToken
from db.session import session_scope
from db.tokens import create_token

BODY = {"name": "e", "model": "debug", "gpu_counts": [1], "precisions": ["fp32"], "steps": 3, "warmup_steps": 1}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def submit_token(pg_session_factory) -> tuple[str, int]:
    with session_scope(pg_session_factory) as s:
        token, row = create_token(s, "ci", role="submit")
        return token, row.id


def test_a_submit_token_writes_experiments_but_not_tokens_or_webhooks(client, submit_token) -> None:
    token, _ = submit_token
    headers = _bearer(token)
    assert client.post("/experiments", json=BODY, headers=headers).status_code == 201
    for method, path, body in [
        ("GET", "/tokens", None),
        ("POST", "/tokens", {"name": "mine", "role": "admin"}),
        ("POST", "/tokens", {"name": "mine"}),
        ("GET", "/webhooks", None),
        ("POST", "/webhooks", {"url": "https://hooks.example.com/x", "events": ["regression.confirmed"]}),
        ("DELETE", "/webhooks/1", None),
    ]:
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["errors"][0] == {
            "field": "header.Authorization",
            "message": r.json()["errors"][0]["message"],
            "allowed": ["admin"],
        }
        assert "is submit" in r.json()["detail"]


def test_an_admin_makes_tokens_of_either_role_submit_by_default(client) -> None:
    made = client.post("/tokens", json={"name": "laptop"})
    assert made.status_code == 201 and made.json()["role"] == "submit"
    admin = client.post("/tokens", json={"name": "ops", "role": "admin"}).json()
    assert admin["role"] == "admin"
    assert client.post("/tokens", json={"name": "x", "role": "root"}).json()["errors"][0]["field"] == "role"
    assert {t["name"]: t["role"] for t in client.get("/tokens").json()} == {
        "tests": "admin",
        "laptop": "submit",
        "ops": "admin",
    }


def test_a_submit_token_revokes_only_itself(client, api_token, submit_token, pg_session_factory) -> None:
    token, own_id = submit_token
    with session_scope(pg_session_factory) as s:
        operator_id = s.query(ApiToken).filter_by(name="tests").one().id
        _, peer = create_token(s, "peer", role="submit")
        peer_id = peer.id
    refused = client.delete(f"/tokens/{operator_id}", headers=_bearer(token))
    assert refused.status_code == 403 and refused.json()["errors"][0]["field"] == "token_id", refused.text
    assert client.get("/tokens").status_code == 200  # the operator's token still works
    peer_refused = client.delete(f"/tokens/{peer_id}", headers=_bearer(token))  # same role, another's
    assert peer_refused.status_code == 403 and "only itself" in peer_refused.json()["detail"]
    assert peer_refused.json()["errors"][0]["allowed"] == [own_id]
    assert client.delete(f"/tokens/{own_id}", headers=_bearer(token)).status_code == 200  # its own
    again = client.delete(f"/tokens/{own_id}")  # by an admin: already revoked, unchanged
    assert again.status_code == 200 and again.json()["revoked_at"] is not None
    assert client.delete(f"/tokens/{peer_id}").status_code == 200  # an admin revokes any token
    assert client.post("/experiments", json=BODY, headers=_bearer(token)).status_code == 401
    assert client.delete(f"/tokens/{operator_id}").status_code == 200  # an admin may revoke an admin, itself too


def test_idempotency_keys_are_per_token(client, submit_token) -> None:
    token, _ = submit_token
    key = {"Idempotency-Key": "nightly-2026-12-04"}
    a = client.post("/experiments", json=BODY, headers=key)
    b = client.post("/experiments", json=BODY, headers=key | _bearer(token))
    assert a.status_code == b.status_code == 201, b.text
    assert a.json()["id"] != b.json()["id"] and "idempotent-replayed" not in b.headers
    again = client.post("/experiments", json=BODY, headers=key | _bearer(token))
    assert again.json()["id"] == b.json()["id"] and again.headers["idempotent-replayed"] == "true"
    other_body = client.post("/experiments", json=BODY | {"name": "other"}, headers=key | _bearer(token))
    assert other_body.status_code == 409


def test_the_operators_token_from_the_server_is_admin(client, test_settings) -> None:
    token = create_token_on(test_settings.database_url, "first")
    assert client.get("/tokens", headers=_bearer(token)).status_code == 200
    submit = create_token_on(test_settings.database_url, "ci", role="submit")
    assert client.get("/tokens", headers=_bearer(submit)).status_code == 403
