"""The real-text data build (runner.corpus), its held-out split, and eval loss in a RunResult (CPU, seconds)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from runner import corpus
from runner.data import MemmapTokens, make_eval_batches
from tests.runner.conftest import make_spec

pytest.importorskip("tokenizers")

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
    "and",
    "every",
    "sentence",
    "of",
    "this",
    "small",
    "corpus",
    "repeats",
    "words",
    "so",
    "that",
    "pairs",
    "of",
    "bytes",
    "merge",
]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """120 small English-like documents (enough for a held-out split at 3% by name hash)."""
    d = tmp_path_factory.mktemp("text")
    for i in range(120):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(60)]
        (d / f"doc{i:03d}.txt").write_text(" ".join(words).capitalize() + ".\n")
    return d


@pytest.fixture(scope="module")
def built(text_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    return out, corpus.build(out, name="tiny", text_dir=text_dir, vocab_size=400)


def test_build_writes_files_and_checksums_stable_across_builds(built, text_dir, tmp_path):
    out, recipe = built
    again = corpus.build(tmp_path, name="tiny", text_dir=text_dir, vocab_size=400)
    assert again["sha256"] == recipe["sha256"] and again["text_sha256"] == recipe["text_sha256"]
    for key in ("train", "val", "tokenizer"):
        assert (out / recipe["files"][key]).is_file()
        assert corpus.sha256_file(out / recipe["files"][key]) == recipe["sha256"][key]
    assert json.loads((out / "tiny.json").read_text()) == recipe
    assert recipe["documents"]["val"] >= 1 and recipe["documents"]["train"] > recipe["documents"]["val"]
    assert recipe["dtype"] == "uint16" and recipe["tokenizer"]["vocab_size"] <= 400
    train = np.fromfile(out / "tiny.bin", dtype="<u2")
    assert train.size == recipe["tokens"]["train"] and train.max() < recipe["tokenizer"]["vocab_size"]
    assert (train == recipe["tokenizer"]["eot_id"]).sum() == recipe["documents"]["train"]  # one per document
    assert corpus.check(out / "tiny.bin") == []


def test_check_and_describe_name_the_checksums(built):
    out, recipe = built
    text = corpus.describe(out / "tiny.bin")
    assert text.startswith(f"tiny.bin sha256:{recipe['sha256']['train']}")
    assert recipe["sha256"]["tokenizer"] in text and recipe["text_sha256"] in text


def test_check_command_says_what_is_missing_in_one_line(built, tmp_path, capsys):
    out, _ = built
    assert corpus.main(["check", str(out / "tiny.bin")]) == 0
    capsys.readouterr()
    assert corpus.main(["check", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err == f"error: data file '{tmp_path / 'nope'}' does not exist\n"
    assert corpus.main(["check", str(tmp_path)]) == 1
    directory = f"error: data file '{tmp_path}' is a directory; give the token file (.bin) in it\n"
    assert capsys.readouterr().err == directory
    (tmp_path / "other.bin").write_bytes(b"\0\0")  # a token file made some other way
    assert corpus.main(["check", str(tmp_path / "other.bin")]) == 1
    assert capsys.readouterr().err == f"error: no recipe beside {tmp_path / 'other.bin'} ({tmp_path / 'other.json'})\n"


def test_memmap_reads_the_recipe_dtype_and_refuses_a_larger_vocab(built):
    out, _ = built
    src = MemmapTokens(str(out / "tiny.bin"), vocab_size=128256, seed=0)  # a Llama-3 vocab: still uint16
    assert src.tokens.dtype == np.dtype("<u2")
    with pytest.raises(ValueError, match="exceeds the model's vocab_size"):
        MemmapTokens(str(out / "tiny.bin"), vocab_size=256, seed=0)


def test_held_out_batches_are_the_val_split_and_fixed(built):
    import torch

    out, _ = built
    spec = make_spec(data_path="tiny.bin", data_roots=[str(out)], eval_every_steps=4, seq_len=16, local_batch_size=2)
    a = make_eval_batches(spec, 2048, 0, torch.device("cpu"))
    b = make_eval_batches(spec.model_copy(update={"seed": 99}), 2048, 0, torch.device("cpu"))
    val = np.fromfile(out / "tiny.val", dtype="<u2")
    x, _ = a.get(0)
    assert torch.equal(x, b.get(0)[0])  # the same held-out tokens for every seed
    first = x[0].numpy()
    assert any(np.array_equal(val[i : i + 16], first) for i in range(val.size - 16))


@pytest.mark.parametrize("data", ["synthetic", "corpus"])
def test_eval_loss_in_run_result(built, data):
    from runner.train import run

    out, recipe = built
    where = {"data_path": "tiny.bin", "data_roots": [str(out)]} if data == "corpus" else {}
    spec = make_spec(steps=10, warmup_steps=2, eval_every_steps=4, eval_batches=2, seq_len=16, **where)
    result = run(spec)
    assert result.status == "succeeded", result.error
    curve = result.numerics.eval_curve
    assert [p.step for p in curve] == [3, 7, 9]  # every 4 steps and after the last
    assert all(p.loss is not None and math.isfinite(p.loss) for p in curve)
    assert all(p.num_tokens == 2 * 4 * 16 for p in curve)
    assert result.summary.num_timed_steps == 8  # eval intervals are not steps: 10 - 2 warm-up
    assert len(result.steps) == 10
    if data == "corpus":
        assert result.numerics.data.startswith(f"tiny.bin sha256:{recipe['sha256']['train']}")
    else:
        assert result.numerics.data == "synthetic"


def test_code_recipe_takes_whole_files_in_order_and_records_versions(tmp_path):
    """--code: every *.py file of a package, whole and in path order; the recipe names the package versions."""
    import importlib.metadata

    root, _, _ = corpus.code_root("json")
    files = sorted(root.rglob("*.py"))
    docs = list(corpus.code_documents(["json"]))
    assert [d.name for d in docs] == [f"code:json/{p.relative_to(root).as_posix()}" for p in files]
    assert [d.text for d in docs] == [corpus._clean(p.read_text(encoding="utf-8")) for p in files]
    assert corpus.code_root("numpy")[1] == importlib.metadata.version("numpy")
    assert corpus.code_root("stdlib")[0] / "json" == root
    recipe = corpus.build(tmp_path, name="code", code=["json"], vocab_size=400)
    assert recipe["source"] == "code:json" and recipe["code_versions"] == {"json": None}  # no distribution
    assert recipe["documents"]["train"] + recipe["documents"]["val"] == len(docs)
    assert corpus.check(tmp_path / "code.bin") == []
    with pytest.raises(ValueError, match="'no_such_package' is neither 'stdlib' nor an installed package"):
        corpus.build(tmp_path, code=["no_such_package"])
