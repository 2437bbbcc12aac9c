"""GET /runs/{id} (summary, error, Slurm job id, steps), /runs/{id}/steps, /runs/{id}/log, /clusters, health."""

from __future__ import annotations

import db.runs
from db.session import session_scope
from tests.db.helpers import add_experiment, failed_result, succeeded_result


def test_run_detail_with_summary_and_steps(client, pg_session_factory, tmp_path):
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w1", "node-1", 30)
        db.runs.update_launch(s, ids[0], run_dir=str(tmp_path), slurm_job_id="1234")
        db.runs.record_result(s, ids[0], succeeded_result(num_steps=6))
    r = client.get(f"/runs/{ids[0]}")
    assert r.status_code == 200
    run = r.json()
    assert (run["status"], run["slurm_job_id"], run["host"], run["error"]) == ("succeeded", "1234", "node-1", None)
    assert run["summary"]["tokens_per_sec"] == 1.5e5 and run["summary"]["mfu_note"] == "unknown device cpu"
    # the run's figures as the experiment's run list gives them, not null
    [listed] = [x for x in client.get(f"/experiments/{run['experiment_id']}/runs").json()["items"] if x["id"] == ids[0]]
    assert run["tokens_per_sec_per_device"] == listed["tokens_per_sec_per_device"] is not None
    assert run["step_ms_median"] == listed["step_ms_median"] == run["summary"]["step_ms_median"]
    assert run["steps"] is None and run["links"]["steps"] == f"/runs/{ids[0]}/steps"
    assert run["spec"]["precision"] == "bf16" and run["result"]["numerics"]["final_loss"] == 4.7
    inline = client.get(f"/runs/{ids[0]}", params={"include_steps": True}).json()["steps"]
    assert [x["step"] for x in inline] == list(range(6)) and inline == client.get(f"/runs/{ids[0]}/steps").json()


def test_failed_run_shows_its_error(client, pg_session_factory):
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[1], "w", "h", 30)
        db.runs.record_result(s, ids[1], failed_result("comm_timeout", "NCCL watchdog timeout"))
    run = client.get(f"/runs/{ids[1]}").json()
    assert run["error"] == {"kind": "comm_timeout", "message": "NCCL watchdog timeout"} and run["summary"] is None


def test_log_tail_or_404(client, pg_session_factory, tmp_path):
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
    r = client.get(f"/runs/{ids[0]}/log")
    assert r.status_code == 404 and "no log yet" in r.json()["detail"]
    with session_scope(pg_session_factory) as s:
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        db.runs.update_launch(s, ids[0], run_dir=str(tmp_path))
    (tmp_path / "log.txt").write_text("step 0\n")  # a log on a disk the API does not read
    assert client.get(f"/runs/{ids[0]}/log").status_code == 404  # nothing shipped to the store yet
    log = "".join(f"step {i} loss 3.0\n" for i in range(1000)).encode()
    with session_scope(pg_session_factory) as s:
        db.runs.store_log(s, ids[0], log, len(log))
    r = client.get(f"/runs/{ids[0]}/log", params={"tail_bytes": 100})
    assert r.status_code == 200 and r.text.endswith("step 999 loss 3.0\n") and len(r.text) == 100
    assert r.headers["X-Log-Bytes"] == str(len(log)) and r.headers["X-Log-Final"] == "false"
    big = b"x" * (db.runs.LOG_STORE_MAX_BYTES + 10) + b"\x00end\n"  # capped at the newest bytes; NUL made text-safe
    with session_scope(pg_session_factory) as s:
        db.runs.store_log(s, ids[0], big, len(big), final=True)
        db.runs.store_log(s, ids[0], b"late live tail", 14)  # never replaces the final tail
    r = client.get(f"/runs/{ids[0]}/log", params={"tail_bytes": 1 << 20})
    assert r.text.endswith("\ufffdend\n") and r.headers["X-Log-Final"] == "true"
    assert r.headers["X-Log-Bytes"] == str(len(big))


def test_clusters_lists_local_cpu_and_configured(make_client, test_settings, tmp_path):
    from dataclasses import replace

    f = tmp_path / "clusters.toml"
    f.write_text(
        '[[cluster]]\nname = "h200-pod"\nvendor = "nvidia"\ndevice_name = "NVIDIA H200"\n'
        'gpus_per_node = 8\nmax_nodes = 4\nlauncher = "slurm"\nqueue = "h200"\n'
    )
    got = make_client(replace(test_settings, clusters_file=str(f))).get("/clusters").json()
    assert [c["name"] for c in got] == ["h200-pod", "local-cpu"]
    assert got[0]["max_devices"] == 32 and got[0]["queue"] == "h200" and got[1]["vendor"] == "cpu"


def test_health_and_readiness(client, make_client, test_settings):
    from dataclasses import replace

    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "broker": "ok"}
    broken = make_client(
        replace(
            test_settings, broker_url="redis://127.0.0.1:1/0", database_url="postgresql+psycopg://root@127.0.0.1:1/nope"
        )
    )
    r = broken.get("/readyz")
    assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == ["database", "broker"]
    only_broker = make_client(replace(test_settings, broker_url="redis://127.0.0.1:1/0")).get("/readyz")
    assert [e["field"] for e in only_broker.json()["errors"]] == ["broker"]
    assert "127.0.0.1:1" in only_broker.json()["errors"][0]["message"]
