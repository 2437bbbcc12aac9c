"""`scalebench show` against a real server (uvicorn on the test Postgres): beyond the measured range it prints the
projection (GET /experiments/{id}/projection) with its 80% interval, and the fits give no second prediction; a
projection the server refuses (a cluster without a network) is one note line."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as cli
from core.settings import Settings
from tests.clusters import networked_cluster_toml
from tests.live_server import live_server

CLUSTERS_TOML = networked_cluster_toml("h100-ib", "NVIDIA H100 80GB HBM3", 64, "h100-hgx")
# tokens/s per device of an imported 8 -> 64 GPU series (E(64) = 96%)
PER_DEVICE = {8: 5000.0, 16: 4950.0, 32: 4875.0, 64: 4800.0}


@pytest.fixture
def server(test_settings: Settings, tmp_path) -> Iterator[str]:
    f = tmp_path / "clusters.toml"
    f.write_text(CLUSTERS_TOML)
    with live_server(replace(test_settings, clusters_file=str(f))) as url:
        yield url


def _import(server: str, token: str, body: dict) -> int:
    r = httpx.post(f"{server}/experiments/import", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _h100(server: str, token: str) -> int:
    points = [
        {"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec_per_device": x}
        for n, x in PER_DEVICE.items()
    ]
    body = {"name": "h100 8 to 64", "model": "8b", "cluster": "h100-ib", "scaling": "weak", "seq_len": 8192}
    return _import(server, token, {**body, "local_batch_size": 2, "points": points})


def _show(server: str, token: str, exp_id: int):
    result = CliRunner().invoke(cli, ["show", str(exp_id), "--server", server, "--token", token])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_prints_the_projection_interval_beyond_the_measured_range(server, api_token) -> None:
    exp_id = _h100(server, api_token)
    projected = httpx.get(f"{server}/experiments/{exp_id}/projection").json()
    (series,) = projected["series"]
    served = {p["num_devices"]: p for p in series["points"]}
    out = _show(server, api_token, exp_id)
    table = out.split("Projected beyond the measured range", 1)[1]
    rows = {int(cells[2]): cells for cells in _rows(table) if cells[0] == "bf16"}
    assert sorted(rows) == [128, 256, 512, 1024]  # the default counts above the largest measured N, 64
    for n, cells in rows.items():
        p = served[n]
        assert p["efficiency_low"] < p["efficiency"] < p["efficiency_high"]
        assert cells[3] == f"{p['efficiency']:.1%}"
        assert cells[4] == f"{p['efficiency_low']:.1%}-{p['efficiency_high']:.1%}"
        assert cells[5] == f"{p['tokens_per_sec_per_device']:,.0f}"
    # a note is a mark on its rows and its text once under the table
    flat = " ".join(out.split())
    (mark,) = [m for m in rows[1024][6].split() if f"{m}: beyond the cluster's 512 devices" in flat]
    assert mark not in rows[512][6].split()
    # the fits: no value at the cluster's 512 GPUs, a note pointing to the projection instead
    assert "N=512 is outside the measured range 8..64: the Amdahl/USL fits describe the measured range only" in (
        " ".join(out.split())
    )
    assert "on cluster h100-ib's network (cluster 'h100-ib' [cluster.network])" in " ".join(out.split())
    assert "; stack of every series: the scalebench runner's (FSDP2 as TorchTitan applies it)" in " ".join(out.split())
    # an fsdp series: the caption says how often the interval held the published fsdp points
    (family,) = [n for n in series["notes"] if n.startswith("80% interval")]
    assert family in " ".join(out.split()) and "layout family fsdp" in family
    assert "extrapolat" not in out and "predicted" not in out


def test_show_prints_one_note_line_when_the_projection_is_refused(server, api_token) -> None:
    points = [{"num_devices": n, "precision": "bf16", "layout": "fsdp", "tokens_per_sec": 1000.0 * n} for n in (1, 2)]
    body = {"name": "cpu", "model": "debug", "cluster": "local-cpu", "seq_len": 256, "points": points}
    exp_id = _import(server, api_token, body)
    refused = httpx.get(f"{server}/experiments/{exp_id}/projection")
    assert refused.status_code == 422
    out = _show(server, api_token, exp_id)
    (line,) = [line for line in out.splitlines() if "projection" in line]
    assert line == f"note: no projection beyond the measured range: {refused.json()['detail']}"
    assert "describes no network" in line
    assert "Projected beyond the measured range" not in out and "Traceback" not in out
    assert "Scaling" in out  # the rest of the report is printed


def test_projection_csv_carries_the_interval_columns(server, api_token) -> None:
    exp_id = _h100(server, api_token)
    r = httpx.get(f"{server}/experiments/{exp_id}/projection?format=csv&gpu_counts=1024")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = {int(row["num_devices"]): row for row in csv.DictReader(io.StringIO(r.text))}
    assert sorted(rows) == [8, 16, 32, 64, 1024]
    far = rows[1024]
    low, mid, high = (float(far[c]) for c in ("efficiency_low", "efficiency", "efficiency_high"))
    assert low < mid < high and far["measured_tokens_per_sec"] == ""
    assert float(far["tokens_per_sec_low"]) < float(far["tokens_per_sec"]) < float(far["tokens_per_sec_high"])


def _rows(text: str) -> list[list[str]]:
    """The cells of a rich table's body rows (lines with the │ separator)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.count("│") >= 2]


def test_plan_weighs_pp_and_cp_unless_told_measured_only(server, api_token) -> None:
    exp_id = _h100(server, api_token)
    args = ["plan", str(exp_id), "--tokens", "1T", "--max-gpus", "512", "--server", server, "--token", api_token]

    def layouts(*extra: str) -> set[str]:
        result = CliRunner().invoke(cli, [*args, *extra, "--json"])
        assert result.exit_code == 0, result.output
        return {o["layout"] for r in json.loads(result.stdout)["rows"] for o in r["options"]}

    assert layouts() == {"fsdp", "pp=2+fsdp", "pp=4+fsdp", "pp=8+fsdp", "cp=2+fsdp"}
    assert layouts("--measured-only") == {"fsdp"}
    assert layouts("--layout", "cp=2+fsdp") == {"fsdp", "cp=2+fsdp"}
    both = CliRunner().invoke(cli, [*args, "--measured-only", "--layout", "pp=2+fsdp"])
    assert both.exit_code != 0 and "--measured-only" in both.output
