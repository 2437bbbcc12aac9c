"""A token file whose contents the model cannot read fails the run as invalid_config naming data_path (runner.data
MemmapTokens, checked once at open): an id beyond vocab_size, an empty file, a partial token, too few tokens. The
held-out .val split is checked the same way."""

from __future__ import annotations

import numpy as np
import pytest

from runner.train import run
from tests.runner.conftest import make_spec

DEBUG_VOCAB = 2048  # the debug shape's


def _write(root, name: str, content: bytes) -> None:
    (root / name).write_bytes(content)


CASES = [
    (np.array([1, 2, 65000] * 100, dtype="<u2").tobytes(), "holds token id 65000, beyond the model's vocab_size (2048"),
    (b"", "is empty (0 bytes)"),
    (b"\1" * 4097, "is 4097 bytes, not a multiple of 2 (the size of one uint16 token)"),
    (np.arange(5, dtype="<u2").tobytes(), "holds 5 tokens, fewer than seq_len + 1 (33)"),
]


@pytest.mark.parametrize("content,expected", CASES, ids=["id-beyond-vocab", "empty", "partial-token", "too-short"])
def test_a_bad_token_file_fails_the_run_as_invalid_config_naming_data_path(tmp_path, content, expected) -> None:
    _write(tmp_path, "bad.bin", content)
    result = run(make_spec(steps=3, warmup_steps=1, data_path="bad.bin", data_roots=[str(tmp_path)]))
    assert result.status == "failed" and result.error is not None
    assert result.error.kind == "invalid_config", result.error.message
    assert f"data_path 'bad.bin' {expected}" in result.error.message, result.error.message


def test_a_held_out_split_with_an_id_beyond_the_vocab_fails_before_training(tmp_path) -> None:
    (np.arange(4096) % DEBUG_VOCAB).astype("<u2").tofile(tmp_path / "good.bin")
    np.array([7, DEBUG_VOCAB + 5] * 200, dtype="<u2").tofile(tmp_path / "good.val")
    spec = make_spec(steps=3, warmup_steps=1, data_path="good.bin", data_roots=[str(tmp_path)], eval_every_steps=2)
    result = run(spec)
    assert result.status == "failed" and result.error is not None
    assert result.error.kind == "invalid_config", result.error.message
    assert "held-out split of data_path 'good.val' holds token id 2053" in result.error.message
    assert "vocab_size (2048" in result.error.message
    assert result.steps == []  # refused at open, before any step


def test_a_file_too_large_to_scan_at_open_is_checked_window_by_window(tmp_path, monkeypatch) -> None:
    import runner.data

    monkeypatch.setattr(runner.data, "FULL_SCAN_TOKENS", 100)
    tokens = np.array([1, 2, 3] * 1000, dtype="<u2")
    tokens[2000:] = 65000  # the windows the seeded offsets reach hold ids beyond the vocab
    tokens.tofile(tmp_path / "big.bin")
    source = runner.data.MemmapTokens(tmp_path / "big.bin", DEBUG_VOCAB, seed=0, name="big.bin")  # opens: not scanned
    with pytest.raises(runner.data.DataOpenError, match=r"data_path 'big.bin' holds token id 65000 \(in the window"):
        for step in range(200):
            source.sequence(step, 0, 33)
