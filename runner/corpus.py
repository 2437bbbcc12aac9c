"""Real-text training data built offline: a corpus, a byte-level BPE tokenizer trained on it, token files.

    python -m runner.corpus build --out data/            # -> data/pydocs-32k.{bin,val,json,tokenizer.json}
    python -m runner.corpus build --out data/ --text-dir DIR --name mytext --vocab-size 32000
    python -m runner.corpus build --out data/ --name pycode-32k --code stdlib --code numpy --code sqlalchemy \
        --code pandas                                    # source code: ~15 M train tokens (the GPU runs' corpus)
    python -m runner.corpus check data/pydocs-32k.bin    # re-hash the files against the recipe

Nothing is downloaded. The default text is English prose that every Python installation ships: the language
reference and tutorial topics of `pydoc_data.topics`, and the docstrings (of modules, classes and functions)
and comment paragraphs of the standard library's modules (read with ast and tokenize, nothing imported; tests/,
idlelib/, site-packages/ left out): ~3.8 M characters, ~0.9 M tokens with Python 3.11. `--text-dir` takes every
*.txt, *.rst and *.md file under a directory instead (sorted by path).

Source code (`--code NAME`, repeatable): every *.py file, whole, of the standard library (`stdlib`: the running
Python's, the directories above left out) and of installed packages (an importable top-level package name: its
directory in site-packages, `tests`/`test` directories left out), in the order given, files sorted by path; one
document per file. The recipe records the Python version and each package's distribution version: the same
versions give the same text (text_sha256), tokenizer and token files. Sizes seen with Python 3.11.7 and the dev
venv's pins (stdlib, numpy, sqlalchemy, pandas): bench/results/2026-12-04-time-to-loss-h200.md.

Recipe (fixed; recorded in <name>.json with the checksums, so a number can be reproduced):
- documents: one per topic and per module (its docstrings of 3+ words, then its comment paragraphs of 4+ words,
  joined by blank lines), in sorted order, text normalized to NFC with trailing whitespace stripped;
- split: a document goes to the held-out split when sha256(document name) mod 1000 < VAL_PER_MILLE (30: ~3%);
- tokenizer: `tokenizers` BPE over bytes (ByteLevel pre-tokenizer and decoder, no prefix space), vocab up to
  32,000 (the stdlib text stops at ~23,000 merges of frequency >= 2), special token <|endoftext|> = id 0, trained
  on the train split only, one thread;
- token files: each document's ids followed by <|endoftext|>, concatenated, little-endian uint16 (uint32 when the
  vocab exceeds 65,535): <name>.bin (train) and <name>.val (held-out), what runner.data.MemmapTokens reads.

`tokenizers` is needed to build (the `corpus` extra), not to train: a GPU node needs only the built files
(numpy reads them). This module imports neither torch nor tokenizers at import time.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import logging
import os
import sys
import sysconfig
import tokenize
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
DEFAULT_NAME = "pydocs-32k"
DEFAULT_VOCAB_SIZE = 32000
MIN_FREQUENCY = 2
VAL_PER_MILLE = 30  # documents in the held-out split, per thousand (by hash of the name)
EOT = "<|endoftext|>"
MAX_HASHED_BYTES = 1 << 30  # a token file without a recipe is hashed at run start only up to 1 GiB
SKIPPED_STDLIB_DIRS = ("test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo")
SKIPPED_PACKAGE_DIRS = ("test", "tests", "__pycache__")
STDLIB = "stdlib"  # --code's name of the running Python's standard library
TEXT_SUFFIXES = (".txt", ".rst", ".md")


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc.split()) >= 3:  # one- and two-word docstrings are labels, not language
                out.append(doc)
    return out


def _comments(source: str) -> list[str]:
    """Comment paragraphs (consecutive comment lines joined) of at least 4 words; '#' and spacing removed."""
    paragraphs: list[list[str]] = []
    last_line = -2
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type != tokenize.COMMENT:
                continue
            text = t.string.lstrip("#!").strip()
            if not text:
                continue
            if t.start[0] == last_line + 1 and paragraphs:
                paragraphs[-1].append(text)
            else:
                paragraphs.append([text])
            last_line = t.start[0]
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    joined = (" ".join(p) for p in paragraphs)
    return [p for p in joined if len(p.split()) >= 4]


def stdlib_documents(stdlib_dir: Path | None = None) -> Iterator[Document]:
    """The pydoc topics, then the docstrings and comment paragraphs of every standard-library module, in sorted
    order."""
    from pydoc_data.topics import topics  # the language reference as text, shipped with every Python

    for key in sorted(topics):
        yield Document(f"topic:{key}", _clean(topics[key]))
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIPPED_STDLIB_DIRS for part in rel.parts[:-1]):
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        docs = _docstrings(source) + _comments(source)
        if docs:
            yield Document(f"stdlib:{rel.as_posix()}", _clean("\n\n".join(docs)))


def dir_documents(text_dir: Path) -> Iterator[Document]:
    for path in sorted(p for p in Path(text_dir).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()):
        yield Document(f"file:{path.relative_to(text_dir).as_posix()}", _clean(path.read_text(encoding="utf-8")))


def code_root(name: str) -> tuple[Path, str | None, tuple[str, ...]]:
    """(directory, version, skipped directory names) of a --code name: `stdlib` or an installed package."""
    if name == STDLIB:
        return Path(sysconfig.get_paths()["stdlib"]), sys.version.split()[0], SKIPPED_STDLIB_DIRS
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--code {name!r} is neither {STDLIB!r} nor an installed package (a directory)")
    dists = importlib.metadata.packages_distributions().get(name, [name])
    try:
        version = importlib.metadata.version(dists[0])
    except importlib.metadata.PackageNotFoundError:
        version = None
    return Path(list(spec.submodule_search_locations)[0]), version, SKIPPED_PACKAGE_DIRS


def code_documents(names: list[str]) -> Iterator[Document]:
    """Every *.py file of each --code name, whole, in the order given (files sorted by path)."""
    for name in names:
        root, _, skipped = code_root(name)
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part in skipped for part in rel.parts[:-1]):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            yield Document(f"code:{name}/{rel.as_posix()}", _clean(text))


def is_val(name: str) -> bool:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") % 1000 < VAL_PER_MILLE


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _text_sha256(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.name.encode() + b"\0" + d.text.encode() + b"\0")
    return h.hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 65535 else np.dtype("<u4")


def _train_tokenizer(train: list[Document], vocab_size: int):
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the merges do not depend on scheduling
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in train), trainer=trainer, length=len(train))
    return tok


def _encode(tok, docs: list[Document], dtype: np.dtype) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch([d.text for d in docs]):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=dtype)


def build(
    out_dir: Path,
    *,
    name: str = DEFAULT_NAME,
    text_dir: Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    stdlib_dir: Path | None = None,
    code: list[str] | None = None,
) -> dict:
    """Build the corpus into out_dir; returns the recipe (also written to <name>.json). One source: text_dir,
    code (names for --code), or the stdlib docs."""
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be at least 300 (256 bytes + merges), got {vocab_size}")
    if text_dir and code:
        raise ValueError("give text_dir or code, not both")
    code_versions = {c: code_root(c)[1] for c in code or []}  # refuses an unknown name before any work
    if code:
        source = "code:" + ",".join(code)
        documents: Iterator[Document] = code_documents(code)
    elif text_dir:
        source, documents = f"dir:{Path(text_dir).name}", dir_documents(text_dir)
    else:
        source, documents = "python-stdlib-docs", stdlib_documents(stdlib_dir)
    docs = [d for d in documents if d.text]
    if not docs:
        raise ValueError(f"no text found ({source})")
    train = [d for d in docs if not is_val(d.name)]
    val = [d for d in docs if is_val(d.name)]
    if not train or not val:
        raise ValueError(
            f"{len(docs)} documents split into {len(train)} train and {len(val)} held-out: need both (more documents)"
        )
    tok = _train_tokenizer(train, vocab_size)
    dtype = token_dtype(tok.get_vocab_size())
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "train": out_dir / f"{name}.bin",
        "val": out_dir / f"{name}.val",
        "tokenizer": out_dir / f"{name}.tokenizer.json",
    }
    train_ids, val_ids = _encode(tok, train, dtype), _encode(tok, val, dtype)
    train_ids.tofile(paths["train"])
    val_ids.tofile(paths["val"])
    tok.save(str(paths["tokenizer"]))
    import tokenizers

    recipe = {
        "recipe_version": RECIPE_VERSION,
        "name": name,
        "source": source,
        "python_version": sys.version.split()[0] if not text_dir else None,
        **({"code_versions": code_versions} if code else {}),
        "documents": {"train": len(train), "val": len(val)},
        "text_sha256": _text_sha256(docs),
        "text_chars": sum(len(d.text) for d in docs),
        "val_per_mille": VAL_PER_MILLE,
        "tokenizer": {
            "library": "tokenizers",
            "version": tokenizers.__version__,
            "model": "BPE",
            "pre_tokenizer": "ByteLevel(add_prefix_space=False)",
            "vocab_size": tok.get_vocab_size(),
            "min_frequency": MIN_FREQUENCY,
            "special_tokens": [EOT],
            "eot_id": tok.token_to_id(EOT),
        },
        "dtype": dtype.name,
        "tokens": {"train": int(train_ids.size), "val": int(val_ids.size)},
        "sha256": {k: sha256_file(p) for k, p in paths.items()},
        "files": {k: p.name for k, p in paths.items()},
    }
    (out_dir / f"{name}.json").write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe


# ------------------------------------------------------------------------- reading (runner side: numpy)


def recipe_path(data_path: str | Path) -> Path:
    return Path(data_path).with_suffix(".json")


def val_path(data_path: str | Path) -> Path:
    """The held-out split beside a token file: <stem>.val."""
    return Path(data_path).with_suffix(".val")


def load_recipe(data_path: str | Path) -> dict | None:
    """The recipe written beside a built token file, or None (a file made some other way, or a recipe that is not
    a regular file in the data file's own directory: a symlink out of the data roots is not read)."""
    path = recipe_path(data_path)
    real = Path(os.path.realpath(path))
    if real.parent != Path(os.path.realpath(data_path)).parent or not real.is_file():
        return None
    try:
        recipe = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return recipe if isinstance(recipe, dict) and "sha256" in recipe else None


def describe(data_path: str | Path, name: str | None = None) -> str:
    """What Numerics.data records: the file's name (`name`: the spec's, relative to its data root; default the
    base name) and sha256, with the recipe's name, text and tokenizer checksums when the file was built here (the
    recorded checksum is used when the size matches)."""
    path = Path(data_path)
    name = name or path.name
    recipe = load_recipe(path)
    if recipe is None:
        size = path.stat().st_size
        if size > MAX_HASHED_BYTES:  # every rank would hash it at start-up: name and size only
            return f"{name} {size} bytes (not hashed: over {MAX_HASHED_BYTES >> 20} MiB, no recipe beside it)"
        return f"{name} sha256:{sha256_file(path)}"
    digest = recipe["sha256"].get("train")
    expected_bytes = recipe.get("tokens", {}).get("train", -1) * np.dtype(recipe.get("dtype", "uint16")).itemsize
    if path.stat().st_size != expected_bytes:
        digest = sha256_file(path)
    tok = recipe.get("tokenizer", {})
    return (
        f"{name} sha256:{digest}; recipe {recipe.get('name')} v{recipe.get('recipe_version')} "
        f"source {recipe.get('source')} text sha256:{recipe.get('text_sha256')}; tokenizer "
        f"{tok.get('model')} vocab {tok.get('vocab_size')} sha256:{recipe['sha256'].get('tokenizer')}"
    )


def check(data_path: str | Path) -> list[str]:
    """Files whose sha256 differs from the recipe's (empty: all match)."""
    if Path(data_path).is_dir():
        raise IsADirectoryError(f"data file {str(data_path)!r} is a directory; give the token file (.bin) in it")
    if not Path(data_path).is_file():
        raise FileNotFoundError(f"data file {str(data_path)!r} does not exist")
    recipe = load_recipe(data_path)
    if recipe is None:
        raise FileNotFoundError(f"no recipe beside {data_path} ({recipe_path(data_path)})")
    base = Path(data_path).parent
    return [
        k
        for k, name in recipe["files"].items()
        if not (base / name).is_file() or sha256_file(base / name) != recipe["sha256"][k]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.corpus", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the corpus, tokenizer and token files")
    b.add_argument("--out", type=Path, required=True, help="output directory")
    b.add_argument("--name", default=DEFAULT_NAME, help=f"file stem (default {DEFAULT_NAME})")
    b.add_argument("--text-dir", type=Path, help="*.txt/*.rst/*.md files to use instead of the stdlib docs")
    b.add_argument(
        "--code",
        action="append",
        metavar="NAME",
        help=f"source code instead: {STDLIB!r} or an installed package's name (repeatable, in order)",
    )
    b.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    c = sub.add_parser("check", help="re-hash a built corpus against its recipe")
    c.add_argument("data_path", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "build":
        recipe = build(args.out, name=args.name, text_dir=args.text_dir, vocab_size=args.vocab_size, code=args.code)
        log.info(
            "%s: %d train + %d held-out tokens (%s), vocab %d; sha256 %s",
            args.out / recipe["files"]["train"],
            recipe["tokens"]["train"],
            recipe["tokens"]["val"],
            recipe["dtype"],
            recipe["tokenizer"]["vocab_size"],
            json.dumps(recipe["sha256"]),
        )
        return 0
    try:
        bad = check(args.data_path)
    except OSError as exc:  # no such file, no recipe beside it, a directory
        sys.stderr.write(f"error: {exc}\n")
        return 1
    log.info("%s: %s", args.data_path, "all checksums match" if not bad else f"checksum differs: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
