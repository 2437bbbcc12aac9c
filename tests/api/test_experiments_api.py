"""POST/GET/cancel of experiments against the real Postgres and Redis (a message really lands on the queue)."""

from __future__ import annotations

import db.runs
from db.session import session_scope

BODY = {
    "name": "scaling",
    "model": "debug",
    "gpu_counts": [1, 2, 4, 8],
    "precisions": ["bf16", "fp8-tensorwise"],
    "layouts": ["fsdp", "tp=2+fsdp"],
    "steps": 4,
    "warmup_steps": 1,
    "tags": ["nightly"],
}
PROBLEM = "application/problem+json"


def test_post_creates_runs_and_publishes_one_message_per_run(client, queued_messages, redis_client):
    r = client.post("/experiments", json=BODY)
    assert r.status_code == 201, r.text
    body = r.json()
    assert r.headers["location"] == f"/experiments/{body['id']}"
    run_ids = [x["id"] for x in body["runs"]]
    # 2 precisions x (fsdp at 1, 2, 4 + tp=2+fsdp at 2, 4); N=8 exceeds local-cpu, tp=2 does not divide N=1
    assert len(run_ids) == 10 and body["num_runs"] == 10 and body["dispatched"] is True
    assert {(s["layout"], s["num_devices"]) for s in body["skipped"]} == {
        ("fsdp", 8),
        ("tp=2+fsdp", 8),
        ("tp=2+fsdp", 1),
    }
    assert "exceeds cluster 'local-cpu' size" in body["skipped"][0]["reason"]
    assert redis_client.llen("local-cpu") == 10
    assert sorted(queued_messages("local-cpu")) == sorted(("scalebench.execute_run", [i]) for i in run_ids)


def test_get_experiment_status_counts_progress(client, pg_session_factory):
    exp = client.post("/experiments", json=BODY).json()
    ids = [x["id"] for x in exp["runs"]]
    with session_scope(pg_session_factory) as s:
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        db.runs.mark_failed(s, ids[1], "oom", "boom")
    r = client.get(f"/experiments/{exp['id']}")
    assert r.status_code == 200
    got = r.json()
    assert got["status"] == "running" and got["counts"]["running"] == 1 and got["counts"]["failed"] == 1
    assert got["counts"]["queued"] == 8 and got["progress"] == 0.1 and got["spec"]["gpu_counts"] == [1, 2, 4, 8]
    runs = client.get(f"/experiments/{exp['id']}/runs", params={"status": "failed"}).json()
    assert [x["id"] for x in runs["items"]] == [ids[1]] and runs["items"][0]["error_kind"] == "oom"


def test_matrix_without_valid_point_is_422_naming_every_reason(client, redis_client):
    r = client.post("/experiments", json=BODY | {"gpu_counts": [8, 16], "layouts": ["tp=3"]})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    messages = [e["message"] for e in r.json()["errors"]]
    assert len(messages) == 4 and all(e["field"] == "matrix" for e in r.json()["errors"])
    assert any("bf16/tp=3/N=8" in m for m in messages) and any("fp8-tensorwise/tp=3/N=16" in m for m in messages)
    assert redis_client.llen("local-cpu") == 0


def test_validation_errors_name_fields_and_allowed_values(client):
    r = client.post(
        "/experiments",
        json=BODY | {"precisions": ["fp9"], "model": "huge", "colour": 1, "layouts": ["zigzag"], "gpu_counts": [0]},
    )
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    errors = {e["field"]: e for e in r.json()["errors"]}
    assert "fp8-rowwise" in errors["precisions[0]"]["allowed"] and "8b" in errors["model"]["allowed"]
    assert "gpu_counts" in errors["colour"]["allowed"] and "gpu_counts[0]" in errors
    assert "tp=T+fsdp" in errors["layouts"]["allowed"]
    r = client.post("/experiments", json=BODY | {"cluster": "mi300x-pod"})
    assert r.json()["errors"] == [
        {"field": "cluster", "message": "unknown cluster 'mi300x-pod'", "allowed": ["local-cpu"]}
    ]
    r = client.post("/experiments", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body"
    assert "JSON decode error" in r.json()["errors"][0]["message"]


def test_writes_need_a_valid_bearer_token(anon_client, client):
    r = anon_client.post("/experiments", json=BODY)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert r.json()["errors"][0]["field"] == "header.Authorization"
    assert anon_client.post("/experiments", json=BODY, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert anon_client.post("/experiments", json=BODY, headers={"Authorization": "Basic abc"}).status_code == 401
    assert anon_client.get("/experiments").status_code == 200  # reads are open by default
    exp_id = client.post("/experiments", json=BODY).json()["id"]
    assert anon_client.post(f"/experiments/{exp_id}/cancel").status_code == 401


def test_reads_need_a_token_when_required(make_client, test_settings):
    from dataclasses import replace

    closed = replace(test_settings, require_read_token=True)
    assert make_client(closed, token=False).get("/experiments").status_code == 401
    assert make_client(closed).get("/experiments").status_code == 200
    assert make_client(closed, token=False).get("/healthz").status_code == 200


def test_idempotency_key_replays_or_conflicts(client, redis_client):
    key = {"Idempotency-Key": "nightly-2026-12-02"}
    a = client.post("/experiments", json=BODY, headers=key)
    b = client.post("/experiments", json=BODY, headers=key)
    assert a.status_code == b.status_code == 201 and b.headers["idempotent-replayed"] == "true"
    assert a.json()["id"] == b.json()["id"] and [r["id"] for r in a.json()["runs"]] == [
        r["id"] for r in b.json()["runs"]
    ]
    assert redis_client.llen("local-cpu") == 10  # the replay published nothing
    c = client.post("/experiments", json=BODY | {"name": "other"}, headers=key)
    assert c.status_code == 409 and c.json()["errors"][0]["field"] == "header.Idempotency-Key"
    assert client.get("/experiments").json()["items"].__len__() == 1


def test_list_pagination_and_filters(client):
    ids = [client.post("/experiments", json=BODY | {"tags": [f"t{i % 2}"]}).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        page = client.get("/experiments", params={"limit": 2} | ({"cursor": cursor} if cursor else {})).json()
        seen += [e["id"] for e in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == ids[::-1]
    assert [e["id"] for e in client.get("/experiments", params={"tag": "t1"}).json()["items"]] == [ids[3], ids[1]]
    assert (
        client.get("/experiments", params={"status": "queued", "cluster": "local-cpu"}).json()["items"].__len__() == 5
    )
    assert client.get("/experiments", params={"status": "succeeded"}).json()["items"] == []
    bad = client.get("/experiments", params={"cursor": "garbage"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.cursor"
    bad = client.get("/experiments", params={"status": "done"})
    assert bad.status_code == 422 and "succeeded" in bad.json()["errors"][0]["allowed"]


def test_cancel_queued_and_running(client, pg_session_factory):
    exp = client.post("/experiments", json=BODY).json()
    ids = [x["id"] for x in exp["runs"]]
    with session_scope(pg_session_factory) as s:
        db.runs.claim_run(s, ids[0], "w", "h", 30)
    r = client.post(f"/experiments/{exp['id']}/cancel")
    assert r.status_code == 200
    assert r.json() == {
        "experiment_id": exp["id"],
        "num_cancelled": 9,
        "num_cancel_requested": 1,
        "num_stopping": 1,
        "status": "running",
    }
    run = client.get(f"/runs/{ids[0]}").json()
    assert run["status"] == "running" and run["cancel_requested"] is True
    # a second cancel marks nothing new, and still says that one run is stopping
    again = client.post(f"/experiments/{exp['id']}/cancel").json()
    assert (again["num_cancelled"], again["num_cancel_requested"], again["num_stopping"]) == (0, 0, 1)
    assert client.post("/experiments/999999/cancel").status_code == 404


def test_not_found_is_a_problem(client):
    for path in ("/experiments/424242", "/runs/424242", "/experiments/424242/runs", "/no/such/path"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"] == PROBLEM and r.json()["status"] == 404


def test_unknown_field_lists_the_fields_of_the_model_it_was_sent_to(client) -> None:
    body = {
        "name": "s",
        "shedule": "0 2 * * *",
        "spec": {"name": "e", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"], "colour": "red"},
    }
    errors = {e["field"]: e for e in client.post("/suites", json=body).json()["errors"]}
    assert "schedule" in errors["shedule"]["allowed"] and "gpu_counts" not in errors["shedule"]["allowed"]
    assert "gpu_counts" in errors["spec.colour"]["allowed"]


def test_pipeline_and_context_parallel_points_run_or_are_skipped_with_the_reason(client, queued_messages):
    layouts = ["fsdp", "pp=2+fsdp", "cp=2+fsdp", "cp=2+tp=2"]
    body = BODY | {"name": "pp-cp", "layouts": layouts, "gpu_counts": [2, 4]}
    r = client.post("/experiments", json=body | {"local_batch_size": 2})
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["num_runs"] == 12  # fsdp, pp=2+fsdp and cp=2+fsdp at 2 and 4, both precisions
    skipped = {(s["layout"], s["num_devices"]): s["reason"] for s in out["skipped"]}
    assert set(skipped) == {("cp=2+tp=2", 2), ("cp=2+tp=2", 4)}
    assert "use cp=2+tp=2+fsdp" in skipped[("cp=2+tp=2", 4)]
    # one sequence per data-parallel rank cannot fill a two-stage 1F1B pipeline: skipped, with the field to raise
    one = client.post("/experiments", json=body | {"name": "pp-1", "local_batch_size": 1}).json()
    reasons = {(s["layout"], s["num_devices"]): s["reason"] for s in one["skipped"]}
    assert "local_batch_size" in reasons[("pp=2+fsdp", 2)] and one["num_runs"] == 8  # fsdp and cp=2+fsdp
    deep = client.post(
        "/experiments",
        json=body | {"name": "pp-deep", "layouts": ["pp=4+fsdp"], "num_layers": 2, "local_batch_size": 4},
    )
    assert deep.status_code == 422 and "num_layers(2)" in deep.text  # 2 blocks cannot fill 4 stages
