"""eval_every_steps > 0 reads the held-out split beside data_path (<stem>.val): the matrix checks it with the data
file when the roots are visible, so a missing .val is refused at POST (DataPathError: a 422 naming data_path), not
at run time."""

from __future__ import annotations

from typing import Any

import pytest

from core.contracts import data_paths
from core.contracts.clusters import LOCAL_CPU
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec

SPEC: dict[str, Any] = dict(name="e", model="debug", gpu_counts=[1], precisions=["fp32"], steps=3, warmup_steps=1)


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "good.bin").write_bytes(b"\0" * 4096)
    return LOCAL_CPU.model_copy(update={"data_roots": [str(tmp_path)]})


def _spec(**kw) -> ExperimentSpec:
    return ExperimentSpec(**(SPEC | {"data_path": "corpus/good.bin"} | kw))


def test_a_missing_held_out_split_is_refused_when_evaluation_is_on(cluster) -> None:
    with pytest.raises(data_paths.DataPathError) as exc:
        expand(_spec(eval_every_steps=2), cluster)
    message = str(exc.value)
    assert message.startswith("data_path 'corpus/good.bin': eval_every_steps 2")
    assert "'corpus/good.val', which is missing" in message and "set eval_every_steps 0" in message


def test_without_evaluation_or_with_the_split_the_data_file_is_enough(cluster, tmp_path) -> None:
    assert expand(_spec(), cluster)[0][0].data_path == "corpus/good.bin"
    (tmp_path / "corpus" / "good.val").mkdir()  # not a regular file: still missing
    with pytest.raises(data_paths.DataPathError, match="which is missing"):
        expand(_spec(eval_every_steps=2), cluster)
    (tmp_path / "corpus" / "good.val").rmdir()
    (tmp_path / "corpus" / "good.val").write_bytes(b"\0" * 512)
    runs, _ = expand(_spec(eval_every_steps=2), cluster)
    assert runs[0].eval_every_steps == 2
