"""docs/slurm.md agrees with scripts/slurm/clusters.example.toml and names the real Celery app."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from core.contracts.clusters import load_clusters
from worker.launchers import slurm

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "slurm.md"
EXAMPLE = ROOT / "scripts" / "slurm" / "clusters.example.toml"


def test_doc_block_is_the_example_file():
    doc = DOC.read_text()
    assert "This is `scripts/slurm/clusters.example.toml`:" in doc
    block = re.search(r"This is `scripts/slurm/clusters\.example\.toml`:\n\n```toml\n(.*?)```\n", doc, re.S)
    assert block, "docs/slurm.md: the toml block after the claim is missing"
    assert block.group(1) == EXAMPLE.read_text()
    assert {"mi300x-pod", "h200-pod"} <= set(load_clusters(EXAMPLE))


def test_every_celery_command_names_the_real_app():
    for path in (DOC, EXAMPLE):
        apps = re.findall(r"celery -A (\S+)", path.read_text())
        assert apps and set(apps) == {"worker.main:app"}, (path.name, apps)
    assert type(importlib.import_module("worker.main").app).__name__ == "Celery"


def test_doc_states_the_time_limit_rounding():
    doc = DOC.read_text()
    assert "rounded **up to whole minutes**" in doc and "`timeout_s = 25` gave `TimeLimit=00:01:00`" in doc
    assert slurm.format_slurm_time(25) == "0-00:01:00" and slurm.format_slurm_time(61) == "0-00:02:00"
