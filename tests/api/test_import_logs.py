"""POST /experiments/import/logs on the real Postgres: logs in the real formats of Megatron-LM and TorchTitan
0.2.2 (tests/core/engines/log_formats.py) become an experiment with throughput, loss curves, held-out curves and
the fp8 loss verdict; bad logs get a 422 naming the field."""

from __future__ import annotations

import json

import pytest

from tests.core.engines.log_formats import megatron_log, titan_log

HEAD = {
    "name": "mi300x logs",
    "model": "8b",
    "num_layers": 4,
    "cluster": "mi300x-node",
    "vendor": "amd",
    "device_name": "AMD Instinct MI300X",
    "seq_len": 4096,
    "local_batch_size": 1,
}


def _log(fmt: str, text: str, precision: str, seed: int, **extra) -> dict:
    return {"format": fmt, "text": text, "num_devices": 8, "precision": precision, "seed": seed} | extra


def _post(client, body: dict):
    return client.post("/experiments/import/logs", json=body)


def _verdict(client, exp_id: int) -> dict:
    rep = client.get(f"/experiments/{exp_id}/scaling").json()
    (sp,) = [s for s in rep["speedups"] if s["precision"] != "bf16"]
    return sp


def test_megatron_logs_become_an_experiment_with_a_verdict(client) -> None:
    logs = [
        _log("megatron", megatron_log(1000, seed=s, scale=f, step_ms=ms), p, s)
        for s in (0, 1)
        for p, f, ms in (("bf16", 1.0, 431.5), ("fp8-tensorwise", 1.03, 370.0))
    ]
    r = _post(client, HEAD | {"logs": logs})
    assert r.status_code == 201, r.text
    exp = r.json()
    assert r.headers["location"] == f"/experiments/{exp['id']}"
    assert {(x["engine"], x["seed"]) for x in exp["runs"]} == {("command:megatron", 0), ("command:megatron", 1)}

    run = client.get(f"/runs/{exp['runs'][0]['id']}").json()
    # throughput: 8 sequences x 4096 tokens / the median of iterations 2..1000 (the first is left out)
    assert run["summary"]["step_ms_median"] == pytest.approx(431.5, rel=2e-3)
    assert run["summary"]["num_timed_steps"] == 999 and run["summary"]["step_ms_max"] < 433
    assert run["summary"]["tokens_per_sec"] == pytest.approx(8 * 4096 / 0.4315, rel=2e-3)
    assert run["summary"]["mfu_vs_bf16_peak"] is not None  # the MI300X is in the peak table
    assert run["summary"]["step_time_source"].startswith("imported log:megatron")
    assert run["result"]["numerics"]["eval_curve"][0]["step"] == 49  # "validation loss at iteration 50"
    first = client.get(f"/runs/{exp['runs'][0]['id']}/steps").json()[0]
    assert first["step"] == 0 and first["warmup"] is True and first["step_ms"] == pytest.approx(431.5 * 9, abs=0.1)

    sp = _verdict(client, exp["id"])
    assert sp["speedup"] == pytest.approx(431.5 / 370.0, rel=5e-3)
    assert sp["loss_verdict"] == "differs", sp["loss_verdict_reason"]
    assert sp["loss_numerics"]["source"] == "eval"

    losses = client.get(f"/experiments/{exp['id']}/losses").json()["curves"]
    assert [(c["precision"], c["seed"]) for c in losses] == [
        ("bf16", 0),
        ("bf16", 1),
        ("fp8-tensorwise", 0),
        ("fp8-tensorwise", 1),
    ]
    assert losses[0]["num_steps"] == 1000 and losses[0]["steps"][-1] == 999


def test_torchtitan_logs_track(client) -> None:
    logs = [
        _log("torchtitan", titan_log(1000, seed=s, scale=f, tps=tps), p, s)
        for s in (0, 1)
        for p, f, tps in (("bf16", 1.0, 9000.0), ("fp8-rowwise", 1.001, 9700.0))
    ]
    r = _post(client, HEAD | {"logs": logs})
    assert r.status_code == 201, r.text
    exp = r.json()
    assert {x["engine"] for x in exp["runs"]} == {"torchtitan"}
    run = client.get(f"/runs/{exp['runs'][0]['id']}").json()
    assert run["summary"]["tokens_per_sec_per_device"] == pytest.approx(9000.0, rel=3e-3)  # TorchTitan's tps
    sp = _verdict(client, exp["id"])
    assert sp["speedup"] == pytest.approx(9700 / 9000, rel=5e-3)
    assert sp["loss_verdict"] == "tracks", sp["loss_verdict_reason"]


def _fields(r) -> dict:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return {e["field"]: e for e in r.json()["errors"]}


def test_bad_logs_get_a_422_naming_the_field(client) -> None:
    good = _log("megatron", megatron_log(20), "bf16", 0)
    nothing = _fields(_post(client, HEAD | {"logs": [good, good | {"text": "loss 3.0\nnothing here\n"}]}))
    assert "no training step" in nothing["logs[1].text"]["message"]
    assert "elapsed time per iteration" in nothing["logs[1].text"]["allowed"][0]
    wrong_batch = _fields(_post(client, HEAD | {"local_batch_size": 2, "logs": [good]}))
    assert "global batch size 8" in wrong_batch["logs[0].text"]["message"]
    fmt = _fields(_post(client, HEAD | {"logs": [good | {"format": "nemo"}]}))
    assert "megatron" in fmt["logs[0].format"]["allowed"]
    titan_as_megatron = _fields(_post(client, HEAD | {"logs": [good | {"text": titan_log(20)}]}))
    assert "logs[0].text" in titan_as_megatron
    engine = _fields(_post(client, HEAD | {"logs": [good | {"engine": "primus"}]}))
    assert "logs[0].engine" in engine
    dup = _fields(_post(client, HEAD | {"logs": [good, good]}))
    assert "as logs[0]" in dup["logs[1]"]["message"]
    too_big = _fields(_post(client, HEAD | {"logs": [good | {"num_devices": 16}]}))
    assert "logs[0]" in too_big or "logs[0].text" in too_big
    assert _post(client, {"logs": []}).status_code == 422


def test_jsonl_log_keeps_its_steps_and_held_out_losses(client) -> None:
    lines = [json.dumps({"step": s, "step_ms": 100.0 + s % 3, "loss": 5.0 - s / 100}) for s in range(0, 60, 2)]
    lines += [json.dumps({"step": s, "eval_loss": 4.9 - s / 100}) for s in (19, 39, 59)]
    r = _post(client, HEAD | {"logs": [_log("jsonl", "\n".join(lines), "bf16", 3, warmup_steps=0)]})
    assert r.status_code == 201, r.text
    (run,) = r.json()["runs"]
    assert (run["engine"], run["seed"]) == ("scalebench", 3)
    (curve,) = client.get(f"/experiments/{r.json()['id']}/losses").json()["curves"]
    assert curve["steps"] == list(range(0, 60, 2)) and curve["eval_steps"] == [19, 39, 59]
    summary = client.get(f"/runs/{run['id']}").json()["summary"]
    assert summary["step_ms_median"] == 101.0 and summary["num_timed_steps"] == 30


def test_a_log_step_time_out_of_range_is_named_as_the_log_text(client) -> None:
    for step_ms in ("1e-320", 1e308):
        text = "\n".join(json.dumps({"step": s, "step_ms": step_ms, "loss": 5.0}) for s in range(4))
        err = _fields(_post(client, HEAD | {"logs": [_log("jsonl", text, "bf16", 0, warmup_steps=0)]}))
        assert list(err) == ["logs[0].text"], err
        assert err["logs[0].text"]["message"].startswith("the log's median step time "), err
