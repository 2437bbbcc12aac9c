"""Webhooks per token are capped (each one costs the scheduler's sender time): the token past the cap gets a 422
that names the cap; another token is not affected; deleting one makes room."""

from __future__ import annotations

from db.session import session_scope
from db.tokens import create_token
from db.webhooks import MAX_WEBHOOKS_PER_TOKEN


def test_a_token_owns_at_most_the_cap_of_webhooks(client, make_client, pg_session_factory) -> None:
    ids = []
    for i in range(MAX_WEBHOOKS_PER_TOKEN):
        r = client.post("/webhooks", json={"url": f"https://hooks.example.com/{i}"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    over = client.post("/webhooks", json={"url": "https://hooks.example.com/one-more"})
    assert over.status_code == 422, over.text
    [err] = over.json()["errors"]
    assert err["field"] == "url" and f"the cap is {MAX_WEBHOOKS_PER_TOKEN} webhooks per token" in err["message"]
    with session_scope(pg_session_factory) as s:
        other_token, _ = create_token(s, "other team", role="admin")  # webhooks need an admin token
    other = make_client()
    other.headers["Authorization"] = f"Bearer {other_token}"
    assert other.post("/webhooks", json={"url": "https://hooks.example.com/other"}).status_code == 201
    assert client.delete(f"/webhooks/{ids[0]}").status_code in (200, 204)
    assert client.post("/webhooks", json={"url": "https://hooks.example.com/again"}).status_code == 201
