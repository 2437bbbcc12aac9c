"""data_path over HTTP: a regular file inside the cluster's data roots or a 422 naming data_path, with one message
for every path that is not allowed (missing, a directory, a FIFO, outside, a symlink out); a cluster without
roots offers the synthetic stream only. Anonymous reads show a data checksum only for a file inside the roots."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

import db.runs
from db.models import Run
from db.session import session_scope
from tests.db.helpers import add_experiment, succeeded_result

BODY = {"name": "data", "model": "debug", "gpu_counts": [1], "precisions": ["fp32"], "steps": 3, "warmup_steps": 1}


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "tokens"
    (r / "sub").mkdir(parents=True)
    (r / "sub" / "corpus.bin").write_bytes(b"\0" * 4096)
    (r / "dir").mkdir()
    os.mkfifo(r / "fifo.bin")
    os.symlink("/etc/passwd", r / "passwd.bin")
    return r


@pytest.fixture
def client(make_client, test_settings, tmp_path, root):
    path = tmp_path / "clusters.toml"
    path.write_text(
        f'[[cluster]]\nname = "data"\nvendor = "cpu"\ndevice_name = "cpu"\ngpus_per_node = 1\ndata_roots = ["{root}"]\n'
    )
    return make_client(settings=dataclasses.replace(test_settings, clusters_file=str(path)))


def _problem(response) -> tuple[list[str], str]:
    assert response.status_code == 422, response.text
    body = response.json()
    return [e["field"] for e in body["errors"]], body["errors"][0]["message"]


def test_a_file_inside_the_roots_is_accepted_relative_or_absolute(client, root, pg_session_factory) -> None:
    for path in ("sub/corpus.bin", str(root / "sub" / "corpus.bin")):
        r = client.post("/experiments", json=BODY | {"cluster": "data", "data_path": path})
        assert r.status_code == 201, r.text
        run = client.get(f"/runs/{r.json()['runs'][0]['id']}").json()
        assert run["spec"]["data_path"] == "sub/corpus.bin" and run["spec"]["data_roots"] == [str(root)]


def test_evaluation_without_the_held_out_split_is_a_422_naming_data_path(client, root) -> None:
    body = BODY | {"cluster": "data", "data_path": "sub/corpus.bin", "eval_every_steps": 2}
    fields, message = _problem(client.post("/experiments", json=body))
    assert fields == ["data_path"] and "held-out split 'sub/corpus.val', which is missing" in message, message
    (root / "sub" / "corpus.val").write_bytes(b"\0" * 4096)
    assert client.post("/experiments", json=body).status_code == 201


@pytest.mark.parametrize(
    "path",
    ["/etc/shadow", "/etc/passwd", "../tokens/sub/corpus.bin", "sub/missing.bin", "dir", "fifo.bin", "passwd.bin"],
)
def test_a_path_not_allowed_is_one_422_naming_data_path(client, root, path) -> None:
    fields, message = _problem(client.post("/experiments", json=BODY | {"cluster": "data", "data_path": path}))
    assert fields == ["data_path"]
    assert message == f"data_path {path!r} is not a regular file inside the cluster's data roots ({root}); " + (
        "give a path relative to one of them"
    )


@pytest.mark.parametrize("path", ["sub/corpus.bin\nstep: 1 tps: 2e9", "-rf", "a b", "/d\x00"])
def test_a_path_of_the_wrong_form_is_a_422_naming_data_path(client, path) -> None:
    fields, _ = _problem(client.post("/experiments", json=BODY | {"cluster": "data", "data_path": path}))
    assert fields == ["data_path"]


def test_clusters_list_their_data_roots(client, root) -> None:
    roots = {c["name"]: c["data_roots"] for c in client.get("/clusters").json()}
    assert roots == {"data": [str(root)], "local-cpu": []}


def test_a_cluster_without_roots_takes_no_data_path(client) -> None:
    fields, message = _problem(client.post("/experiments", json=BODY | {"data_path": "sub/corpus.bin"}))
    assert fields == ["data_path"] and "synthetic stream only" in message
    assert client.post("/experiments", json=BODY).status_code == 201


def test_a_suite_template_is_checked_the_same_way(client) -> None:
    body = {"name": "nightly-data", "spec": BODY | {"data_path": "/etc/shadow"}, "cluster": "data"}
    fields, _ = _problem(client.post("/suites", json=body))
    assert fields == ["spec.data_path"]


def test_anonymous_reads_show_a_checksum_only_inside_the_roots(
    client, anon_client, pg_session_factory, root, tmp_path
) -> None:
    """A run recorded before data roots existed (data_path /etc/shadow, no roots) may have hashed any file the
    worker could read: an anonymous reader does not get that checksum; a token holder does."""
    with session_scope(pg_session_factory) as s:
        _, legacy = add_experiment(s)
    with session_scope(pg_session_factory) as s:
        row = s.get(Run, legacy[0])
        row.spec = {k: v for k, v in row.spec.items() if k != "data_roots"} | {"data_path": "/etc/shadow"}
        result = succeeded_result().model_dump(mode="json")
        result["numerics"] = {"final_loss": 1.0, "data": "shadow sha256:a353f2"}
        db.runs.claim_run(s, legacy[0], "w", "h", 30)
        db.runs.record_result(s, legacy[0], type(succeeded_result()).model_validate(result))
    anon = anon_client.get(f"/runs/{legacy[0]}").json()
    assert anon["result"]["numerics"]["data"] is None and "a353f2" not in json.dumps(anon)
    assert client.get(f"/runs/{legacy[0]}").json()["result"]["numerics"]["data"] == "shadow sha256:a353f2"

    created = client.post("/experiments", json=BODY | {"cluster": "data", "data_path": "sub/corpus.bin"}).json()
    run_id = created["runs"][0]["id"]
    with session_scope(pg_session_factory) as s:
        result["numerics"]["data"] = "sub/corpus.bin sha256:0f0f"
        db.runs.claim_run(s, run_id, "w", "h", 30)
        db.runs.record_result(s, run_id, type(succeeded_result()).model_validate(result))
    assert anon_client.get(f"/runs/{run_id}").json()["result"]["numerics"]["data"] == "sub/corpus.bin sha256:0f0f"
