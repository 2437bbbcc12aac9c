"""The runner checks data_path again before it opens anything (runner.failures.validate, runner.data): inside
the run's data roots, a regular file once open, opened within DATA_OPEN_TIMEOUT_S (not the run's timeout_s).
A FIFO, a symlink out of the roots or a path of a run recorded without roots fails the run at once as
invalid_config, with the one message for every path that is not allowed."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from runner import data
from runner.corpus import describe
from runner.data import DataOpenError, MemmapTokens, open_data, resolve_data
from runner.train import run
from tests.runner.conftest import launch, make_spec


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    np.arange(4096, dtype="<u2").tofile(r / "tokens.bin")
    os.mkfifo(r / "fifo.bin")
    (tmp_path / "secret.bin").write_bytes(b"\1" * 8192)
    os.symlink(tmp_path / "secret.bin", r / "escape.bin")
    return r


@pytest.mark.parametrize("path", ["fifo.bin", "escape.bin", "missing.bin", "../secret.bin", "/etc/passwd"])
def test_a_run_on_a_path_not_allowed_fails_at_once_as_invalid_config(root, path) -> None:
    spec = make_spec(steps=3, warmup_steps=1, data_path=path, data_roots=[str(root)], timeout_s=3600)
    t0 = time.monotonic()
    result = run(spec)
    assert time.monotonic() - t0 < 20
    assert result.status == "failed" and result.error.kind == "invalid_config", result.error
    assert "is not a regular file inside the cluster's data roots" in result.error.message


def test_a_run_recorded_without_data_roots_reads_no_file(root) -> None:
    result = run(make_spec(steps=3, warmup_steps=1, data_path=str(root / "tokens.bin")))
    assert result.status == "failed" and result.error.kind == "invalid_config"
    assert "synthetic stream only" in result.error.message


def test_a_file_inside_the_roots_trains_and_is_named_relative_to_its_root(root) -> None:
    (root / "sub").mkdir()
    os.replace(root / "tokens.bin", root / "sub" / "tokens.bin")
    spec = make_spec(steps=3, warmup_steps=1, vocab_size=4096, data_path="sub/tokens.bin", data_roots=[str(root)])
    result = run(spec)
    assert result.status == "succeeded", result.error
    assert result.numerics.data.startswith("sub/tokens.bin sha256:"), result.numerics.data


def test_a_fifo_swapped_in_after_the_check_does_not_block_the_open(root) -> None:
    t0 = time.monotonic()
    with pytest.raises(DataOpenError, match="not a regular file"):
        open_data(root / "fifo.bin")  # resolved earlier as a file; now a FIFO without a writer
    assert time.monotonic() - t0 < 2
    os.symlink(root / "tokens.bin", root / "link.bin")
    with pytest.raises(DataOpenError, match="cannot be opened"):
        open_data(root / "link.bin")  # a symlink swapped in: O_NOFOLLOW
    assert len(MemmapTokens(resolve_data("tokens.bin", [str(root)]), 4096, seed=0).tokens) == 4096


def test_opening_has_its_own_short_timeout(root, monkeypatch) -> None:
    """An open that never returns (a hung network mount) fails after the data timeout, not the run's."""
    monkeypatch.setattr(data, "_open_regular", lambda path: time.sleep(60))
    t0 = time.monotonic()
    with pytest.raises(DataOpenError, match="took over 0.5 s"):
        open_data(root / "tokens.bin", timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_a_recipe_beside_the_file_is_read_only_from_its_own_directory(root, tmp_path) -> None:
    (tmp_path / "elsewhere.json").write_text('{"sha256": {"train": "from-outside"}, "name": "outside"}')
    os.symlink(tmp_path / "elsewhere.json", root / "tokens.json")
    assert "from-outside" not in describe(root / "tokens.bin", name="tokens.bin")


def test_the_runner_process_refuses_too(root, tmp_path) -> None:
    spec = make_spec(steps=3, warmup_steps=1, data_path="fifo.bin", data_roots=[str(root)], timeout_s=3600)
    code, result, log = launch(spec, tmp_path, timeout_s=60)
    assert result is not None and result.error.kind == "invalid_config", log[-2000:]
