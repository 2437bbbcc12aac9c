"""Anonymous `GET /runs/{id}/log` hides what `GET /runs/{id}` hides (run directory, worker, hosts); a token
holder reads the log as stored. Skipped points keep their engine in a 201 and a 422."""

from __future__ import annotations

import dataclasses

import db.runs
from db.session import session_scope
from tests.db.helpers import add_experiment, succeeded_result


def test_the_anonymous_log_hides_run_directories_and_hosts(client, anon_client, pg_session_factory, tmp_path):
    run_dir = tmp_path / "runs" / "run-7"
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "celery@gpu-node-17:4242", "gpu-node-17", 30)
        db.runs.update_launch(s, ids[0], run_dir=str(run_dir))
    log = (
        f"[worker celery@gpu-node-17:4242] starting in {run_dir}\n"
        f"rank 0 on gpu-node-17: writing {run_dir}/trace-rank0.json\n"
        f"an earlier attempt left {tmp_path / 'runs' / 'run-7-a1'}/log.txt\n"
        "step 3/3 loss 4.2\n"
    ).encode()
    with session_scope(pg_session_factory) as s:
        db.runs.store_log(s, ids[0], log, len(log), final=True)
    anon = anon_client.get(f"/runs/{ids[0]}/log")
    assert anon.status_code == 200 and anon.headers["Vary"] == "Authorization"
    for hidden in ("gpu-node-17", str(run_dir), str(tmp_path), "4242"):
        assert hidden not in anon.text, (hidden, anon.text)
    assert "step 3/3 loss 4.2" in anon.text and "<run_dir>/trace-rank0.json" in anon.text
    assert client.get(f"/runs/{ids[0]}/log").text == log.decode()
    # hosts the result recorded (every node of the run) are hidden too
    with session_scope(pg_session_factory) as s:
        result = succeeded_result().model_dump(mode="json") | {
            "environment": {
                "vendor": "cpu",
                "device_name": "cpu",
                "device_count": 2,
                "torch_version": "2",
                "world_size": 2,
                "hosts": ["gpu-node-17", "gpu-node-18"],
            }
        }
        db.runs.record_result(s, ids[0], type(succeeded_result()).model_validate(result))
        db.runs.store_log(s, ids[0], b"rank 1 on gpu-node-18 ready\n", 28, final=True)
    assert "gpu-node-18" not in anon_client.get(f"/runs/{ids[0]}/log").text


CLUSTERS = """
[[cluster]]
name = "gpu"
vendor = "nvidia"
device_name = "NVIDIA H200"
gpus_per_node = 8
"""


def test_skipped_points_keep_their_engine(make_client, test_settings, tmp_path) -> None:
    path = tmp_path / "clusters.toml"
    path.write_text(CLUSTERS)
    client = make_client(settings=dataclasses.replace(test_settings, clusters_file=str(path)))
    body = {"name": "e", "model": "debug", "cluster": "gpu", "gpu_counts": [1], "precisions": ["bf16"], "steps": 9}
    created = client.post("/experiments", json=body | {"engines": ["scalebench", "torchtitan"]})
    assert created.status_code == 201, created.text
    assert [s["engine"] for s in created.json()["skipped"]] == ["torchtitan"]
    refused = client.post("/experiments", json=body | {"engines": ["torchtitan"]})
    assert refused.status_code == 422
    assert [s["engine"] for s in refused.json()["skipped"]] == ["torchtitan"]
