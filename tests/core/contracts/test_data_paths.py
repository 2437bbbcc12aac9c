"""core.contracts.data_paths and the matrix's check: data_path names a regular file inside the cluster's data
roots, relative to one; every other path gets one message (no oracle of what exists outside the roots)."""

from __future__ import annotations

import os

import pytest

from core.contracts import data_paths
from core.contracts.clusters import LOCAL_CPU, Cluster
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec

SPEC = dict(name="e", model="debug", gpu_counts=[1], precisions=["fp32"], steps=3, warmup_steps=1)


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "data"
    (r / "corpus").mkdir(parents=True)
    (r / "corpus" / "tokens.bin").write_bytes(b"\0" * 4096)
    (r / "corpus" / "a-dir").mkdir()
    os.mkfifo(r / "corpus" / "fifo.bin")
    (tmp_path / "outside.bin").write_bytes(b"secret")
    os.symlink(tmp_path / "outside.bin", r / "corpus" / "escape.bin")
    os.symlink(r / "corpus" / "tokens.bin", r / "corpus" / "alias.bin")  # a symlink that stays inside: fine
    return r


def test_a_file_inside_a_root_resolves_relative_or_absolute(root) -> None:
    roots = [str(root)]
    assert data_paths.resolve("corpus/tokens.bin", roots) == root / "corpus" / "tokens.bin"
    assert data_paths.relative_to_roots(str(root / "corpus" / "tokens.bin"), roots) == "corpus/tokens.bin"
    assert data_paths.relative_to_roots("./corpus//tokens.bin", roots) == "corpus/tokens.bin"
    assert data_paths.resolve("corpus/alias.bin", roots) == root / "corpus" / "tokens.bin"
    assert data_paths.name_in_root(root / "corpus" / "tokens.bin", roots) == "corpus/tokens.bin"
    assert data_paths.name_in_root("/etc/passwd", roots) is None


NOT_ALLOWED = [
    "/etc/shadow",
    "/etc/passwd",
    "../outside.bin",
    "corpus/../../outside.bin",
    "corpus/escape.bin",  # a symlink out of the root
    "corpus/a-dir",
    "corpus/fifo.bin",
    "corpus/missing.bin",
    "corpus",
    ".",
]


@pytest.mark.parametrize("path", NOT_ALLOWED)
def test_every_path_not_allowed_gets_the_same_message(root, path) -> None:
    with pytest.raises(data_paths.DataPathError) as exc:
        data_paths.resolve(path, [str(root)])
    assert str(exc.value) == str(data_paths.not_allowed(path, [str(root)]))
    assert "does not exist" not in str(exc.value) and "directory" not in str(exc.value)


@pytest.mark.parametrize("path", ["a\nb.bin", "tokens.bin\r", "-rf", "--help", "a b.bin", "step:1", "x{y}", "$(id)"])
def test_the_form_is_path_like(path) -> None:
    with pytest.raises(data_paths.DataPathError):
        data_paths.check_form(path)
    with pytest.raises(ValueError, match="data_path"):
        ExperimentSpec(**(SPEC | {"data_path": path}))


def test_a_cluster_without_roots_offers_the_synthetic_stream_only(root) -> None:
    with pytest.raises(data_paths.DataPathError, match="synthetic stream only"):
        expand(ExperimentSpec(**(SPEC | {"data_path": "corpus/tokens.bin"})), LOCAL_CPU)
    runs, _ = expand(ExperimentSpec(**SPEC), LOCAL_CPU)
    assert runs[0].data_path is None and runs[0].data_roots == []


def test_runs_carry_the_path_relative_to_the_root_and_the_roots(root) -> None:
    cluster = LOCAL_CPU.model_copy(update={"data_roots": [str(root)]})
    absolute = expand(ExperimentSpec(**(SPEC | {"data_path": str(root / "corpus/tokens.bin")})), cluster)[0]
    relative = expand(ExperimentSpec(**(SPEC | {"data_path": "corpus/tokens.bin"})), cluster)[0]
    assert absolute[0].data_path == relative[0].data_path == "corpus/tokens.bin"
    assert relative[0].data_roots == [str(root)]
    assert absolute[0].run_key() == relative[0].run_key()  # the roots are where, not what: not in the key
    for path in NOT_ALLOWED:
        with pytest.raises(data_paths.DataPathError):
            expand(ExperimentSpec(**(SPEC | {"data_path": path})), cluster)


def test_roots_in_the_clusters_file_are_absolute_and_not_the_whole_disk() -> None:
    base = dict(name="c", vendor="cpu", device_name="cpu", gpus_per_node=1)
    assert Cluster(**base, data_roots=["/data/tokens/"]).data_roots == ["/data/tokens"]
    for bad in (["data"], ["/"], ["/data\n"]):
        with pytest.raises(ValueError, match="data_roots"):
            Cluster(**base, data_roots=bad)
