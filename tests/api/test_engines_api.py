"""Engines over HTTP: named in a request, refused with the field when unknown or not offered; never a command."""

from __future__ import annotations

import dataclasses

import pytest

from db.models import Run

CLUSTERS = """
[[cluster]]
name = "gpu"
vendor = "nvidia"
device_name = "NVIDIA H200"
gpus_per_node = 8
torchtitan = true

[cluster.engines.megatron]
argv = ["bash", "/opt/megatron/train.sh", "{nproc_per_node}", "{seq_len}"]
metrics = "megatron-log"
precisions = ["bf16", "fp8-tensorwise"]
"""
BODY = {
    "name": "engines",
    "model": "debug",
    "cluster": "gpu",
    "gpu_counts": [1, 2],
    "precisions": ["bf16"],
    "steps": 4,
    "warmup_steps": 1,
}


@pytest.fixture
def client(make_client, test_settings, tmp_path):
    path = tmp_path / "clusters.toml"
    path.write_text(CLUSTERS)
    return make_client(settings=dataclasses.replace(test_settings, clusters_file=str(path)))


def _fields(response) -> list[str]:
    return [e["field"] for e in response.json()["errors"]]


def test_engines_expand_into_runs_with_engine_and_seed(client, pg_session_factory) -> None:
    r = client.post(
        "/experiments", json=BODY | {"engines": ["scalebench", "torchtitan", "command:megatron"], "seeds": [0, 1]}
    )
    assert r.status_code == 201, r.text
    runs = r.json()["runs"]
    assert len(runs) == 3 * 2 * 2
    assert {(x["engine"], x["seed"]) for x in runs} == {
        (e, s) for e in ("scalebench", "torchtitan", "command:megatron") for s in (0, 1)
    }
    with pg_session_factory() as s:
        stored = {(run.engine, run.seed) for run in s.query(Run).all()}
    assert stored == {(x["engine"], x["seed"]) for x in runs}
    clusters = {c["name"]: c for c in client.get("/clusters").json()}
    assert clusters["gpu"]["engines"] == ["scalebench", "torchtitan", "command:megatron"]
    assert "argv" not in str(clusters["gpu"])  # the operator's command line is not shown


def test_a_command_engines_stack_is_stored_and_a_runner_engines_is_refused(client) -> None:
    engines = {"engines": ["scalebench", "command:megatron"]}
    r = client.post("/experiments", json=BODY | engines | {"stacks": {"command:megatron": "dp_overlap=None"}})
    assert r.status_code == 201, r.text
    assert client.get(f"/experiments/{r.json()['id']}").json()["spec"]["stacks"] == {
        "command:megatron": "dp_overlap=none"
    }
    for stacks, message in (
        ({"scalebench": "dp_overlap=none"}, "'scalebench' runs the scalebench runner's stack"),
        ({"command:megatron": "overlap=none"}, "command:megatron: 'overlap' is not a stack field; fields: dp_overlap"),
    ):
        bad = client.post("/experiments", json=BODY | engines | {"stacks": stacks})
        assert bad.status_code == 422 and _fields(bad) == ["stacks"] and message in bad.text, bad.text


@pytest.mark.parametrize(
    "engines, message",
    [
        (["megatron"], "is not one of: scalebench, torchtitan, command:<name>"),
        (["command:nemo"], "defines no command engine 'nemo'"),
    ],
)
def test_unknown_or_missing_engine_is_a_422_naming_engines(client, engines, message) -> None:
    r = client.post("/experiments", json=BODY | {"engines": engines})
    assert r.status_code == 422, r.text
    assert _fields(r)[0].startswith("engines") and message in r.text


def test_torchtitan_on_a_cluster_without_it_is_refused_with_the_reason(client) -> None:
    r = client.post("/experiments", json=BODY | {"cluster": "local-cpu", "engines": ["torchtitan"]})
    assert r.status_code == 422 and _fields(r) == ["engines", "engines"]
    assert "does not offer engine torchtitan" in r.text and "pip install '.[torchtitan]'" in r.text


@pytest.mark.parametrize(
    "extra",
    [
        {"command": ["rm", "-rf", "/"]},
        {"argv": ["sh", "-c", "id"]},
        {"engines": ["command:megatron --evil"]},
        {"engines": [{"argv": ["sh"]}]},
    ],
)
def test_a_request_cannot_carry_a_command(client, extra) -> None:
    r = client.post("/experiments", json=BODY | extra)
    assert r.status_code == 422, r.text


def test_steps_below_the_default_warmup_is_a_422_naming_warmup_steps(client) -> None:
    body = {k: v for k, v in BODY.items() if k != "warmup_steps"} | {"steps": 4}
    r = client.post("/experiments", json=body)
    assert r.status_code == 422 and _fields(r) == ["warmup_steps"]
    assert "warmup_steps(5) (the default) must be below steps(4)" in r.text
    assert client.post("/experiments", json=body | {"warmup_steps": 3}).status_code == 201


def test_openapi_documents_the_engine_forms(client) -> None:
    spec = client.get("/openapi.json").json()["components"]["schemas"]["ExperimentSpec"]["properties"]
    text = spec["engines"]["description"]
    assert spec["engines"]["default"] == ["scalebench"]
    assert all(form in text for form in ("scalebench", "torchtitan", "command:<name>", "never carries a command"))
    assert "seeds" in spec and "vocab_size" in spec and "lr_schedule" in spec


def test_pipeline_layouts_run_on_scalebench_and_are_refused_by_the_other_engines(client) -> None:
    body = BODY | {
        "engines": ["scalebench", "torchtitan", "command:megatron"],
        "layouts": ["pp=2+fsdp"],
        "gpu_counts": [2],
        "local_batch_size": 2,
    }
    r = client.post("/experiments", json=body)
    assert r.status_code == 201, r.text
    assert {x["engine"] for x in r.json()["runs"]} == {"scalebench"}
    reasons = {s["engine"]: s["reason"] for s in r.json()["skipped"]}
    assert "without pipeline or context parallelism (pp=2, cp=1)" in reasons["torchtitan"]
    # a team's command runs pp/cp layouts only where the cluster's engine lists them
    assert "only where the cluster's engine lists them" in reasons["command:megatron"]
