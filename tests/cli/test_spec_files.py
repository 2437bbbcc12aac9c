"""Spec files: `.json` is read as JSON, anything else as YAML with YAML 1.2 numbers, so `lr: 3e-4` (as every
config copied from a paper or TorchTitan writes it) is a float, not the string YAML 1.1 makes of it. The end-to-end
submit of such a file against a real API is in test_up.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.client import CliError
from cli.runs import load_spec
from core.contracts.specs import ExperimentSpec

YAML_SPEC = """\
name: lr forms
model: debug
gpu_counts: [1, 2]
precisions: [bf16]
lr: 3e-4
steps: 20
tags: ["3e-4", 1_000.5]
"""


def test_yaml_numbers_are_yaml_1_2(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(YAML_SPEC)
    data = load_spec(path)
    assert data["lr"] == 3e-4 and isinstance(data["lr"], float)
    assert data["steps"] == 20 and isinstance(data["steps"], int)
    assert data["tags"] == ["3e-4", "1_000.5"]  # quoted stays a string; 1.1's underscores are no number in 1.2
    assert ExperimentSpec.model_validate(data).lr == 3e-4


@pytest.mark.parametrize(
    "text, value",
    [("1e5", 1e5), ("+1E+3", 1e3), ("-2.5e-3", -2.5e-3), (".5", 0.5), ("1.", 1.0), ("3.0e-4", 3e-4), ("7", 7)],
)
def test_yaml_float_forms(tmp_path: Path, text: str, value: float) -> None:
    path = tmp_path / "x.yml"
    path.write_text(f"v: {text}\n")
    got = load_spec(path)["v"]
    assert got == value and type(got) is type(value)


def test_json_is_read_as_json(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"name": "j", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"], "lr": 3e-4}')
    assert load_spec(path)["lr"] == 3e-4
    path.write_text('{"lr": NaN}')
    with pytest.raises(CliError, match="not valid JSON"):
        load_spec(path)
    path.write_text("lr: 3e-4\n")  # YAML in a .json file is not JSON
    with pytest.raises(CliError, match="not valid JSON"):
        load_spec(path)
