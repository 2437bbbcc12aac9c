"""The example experiments and clusters files stay valid: each spec expands on the cluster it names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.contracts.clusters import load_clusters
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CLUSTERS = {**load_clusters(EXAMPLES / "clusters.toml"), **load_clusters(EXAMPLES / "clusters-own-stack.toml")}


@pytest.mark.parametrize("name, num_runs", [("cpu-demo.yaml", 6), ("engines-cpu.yaml", 4), ("h200-numerics.yaml", 12)])
def test_example_spec_expands_on_its_cluster(name: str, num_runs: int) -> None:
    spec = ExperimentSpec.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))
    runs, skipped = expand(spec, CLUSTERS[spec.cluster])
    assert len(runs) == num_runs and not skipped
