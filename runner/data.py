"""Deterministic training batches: a learnable synthetic token stream, or a pre-tokenized file (memmap).

Every sequence is addressed by (seed, step, global sequence index), where the global index is
dp_rank * local_batch_size + j. So the data does not depend on the layout: one process with a global batch
of B sees exactly the sequences that B / b data-parallel ranks with b each see, and TP ranks of one DP group
(same dp_rank) see the same batch.

Synthetic stream (learnable, cheap, vectorized): a walk x[t+1] = x[t] + offset[t] (mod A) over A =
min(V, ACTIVE_VOCAB) states whose offsets come from a fixed Zipf-weighted set of NUM_OFFSETS values, mapped
to tokens by a fixed random permutation of the vocabulary. Each token thus has NUM_OFFSETS successors with
fixed probabilities: a bigram model with entropy H(offsets) ~ 2.0 nats, far below ln(V) (7.6 for the debug
vocab, 11.8 for Llama-3's). A small A keeps it learnable in a few hundred steps at any vocab size.

Held-out data (eval loss, spec.eval_every_steps): for a token file, windows of its `.val` split beside it
(<stem>.val, runner.corpus), at offsets drawn from the eval batch index alone, so every evaluation of every run
and seed scores the same held-out tokens; for the synthetic stream, sequences of the same chain (the chain is
the seed's "language") addressed by negative steps, which training never uses.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from core.contracts import data_paths
from runner.corpus import load_recipe
from runner.failures import InvalidConfig

NUM_OFFSETS = 16
# Opening the data file (not reading it) has this limit, independent of the run's timeout_s.
DATA_OPEN_TIMEOUT_S = 30.0
ACTIVE_VOCAB = 256


def _seed_of(*parts: int | str) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class SyntheticTokens:
    """The fixed chain (permutation, offsets, offset probabilities) is drawn from `seed` alone."""

    def __init__(self, vocab_size: int, seed: int):
        self.vocab_size = vocab_size
        self.seed = seed
        gen = torch.Generator().manual_seed(_seed_of(seed, "chain"))
        self.perm = torch.randperm(vocab_size, generator=gen)
        self.num_states = min(vocab_size, ACTIVE_VOCAB)
        self.offsets = torch.randint(1, self.num_states, (NUM_OFFSETS,), generator=gen)
        weights = 1.0 / torch.arange(1, NUM_OFFSETS + 1, dtype=torch.float64)  # Zipf, exponent 1
        self.probs = weights / weights.sum()

    @property
    def entropy_nats(self) -> float:
        """Lower bound of the achievable loss (cross-entropy of the true next-token distribution)."""
        return float(-(self.probs * self.probs.log()).sum())

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(_seed_of(self.seed, step, index))
        start = torch.randint(0, self.num_states, (1,), generator=gen)
        picks = torch.multinomial(self.probs, length - 1, replacement=True, generator=gen)
        walk = torch.cat([start, self.offsets[picks]]).cumsum(0) % self.num_states
        return self.perm[walk]


class DataOpenError(InvalidConfig):
    """A data file that is not allowed, not a regular file once open, that did not open in time, or whose contents
    are not tokens the model can read (empty, a partial token, an id beyond vocab_size, too few tokens)."""


def resolve_data(data_path: str, roots: list[str]) -> Path:
    """The real path of an allowed data file (core.contracts.data_paths: inside a root, a regular file);
    DataOpenError with the one message for every path that is not allowed."""
    try:
        return data_paths.resolve(data_path, roots)
    except data_paths.DataPathError as exc:
        raise DataOpenError(str(exc)) from exc


def _open_regular(path: Path) -> BinaryIO:
    # O_NONBLOCK: a FIFO (put in place of the file after it was resolved) opens at once instead of waiting for a
    # writer; O_NOFOLLOW: a symlink swapped in after resolution is refused. fstat then checks what was opened.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataOpenError(f"data file {path.name!r} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_data(path: Path, timeout_s: float = DATA_OPEN_TIMEOUT_S) -> BinaryIO:
    """Open a resolved data file, giving up after timeout_s (a hung network mount must not hold the run until
    its own timeout_s: the run fails as invalid_config at once; the opening thread is left behind)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["file"] = _open_regular(path)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    opener = threading.Thread(target=target, name="open-data", daemon=True)
    opener.start()
    opener.join(timeout_s)
    if opener.is_alive():
        raise DataOpenError(f"opening data file {path.name!r} took over {timeout_s:g} s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, DataOpenError):
            raise error
        raise DataOpenError(f"data file {path.name!r} cannot be opened ({type(error).__name__})") from error
    return box["file"]


class MemmapTokens:
    """Windows at seeded random offsets of a flat token file. Its dtype is the recipe's beside it (runner.corpus:
    <stem>.json), else uint16 when the model's vocab < 65536 and uint32 otherwise. `path` is a resolved data file
    (resolve_data); it is opened with open_data (regular file, short timeout) and mapped from that descriptor.
    Its contents are checked once, here (check_tokens): DataOpenError (invalid_config) naming `field` and `name`
    (the spec's path; default the file's name)."""

    def __init__(self, path: str | Path, vocab_size: int, seed: int, field: str = "data_path", name: str | None = None):
        path = Path(path)
        shown = name if name is not None else path.name
        self.label = f"{field} {shown!r}"
        data_file = open_data(path)
        with data_file:
            recipe = load_recipe(path)
            if recipe is not None:
                tokenizer_vocab = int(recipe.get("tokenizer", {}).get("vocab_size", 0))
                if tokenizer_vocab > vocab_size:
                    raise DataOpenError(
                        f"{self.label}: its tokenizer's vocab ({tokenizer_vocab}) exceeds the model's "
                        f"vocab_size ({vocab_size}); build it with --vocab-size {vocab_size} or less"
                    )
                dtype = recipe_dtype(self.label, recipe)
            else:
                dtype = np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)
            size = os.fstat(data_file.fileno()).st_size
            check_size(self.label, size, dtype)
            self.tokens = np.memmap(data_file, dtype=dtype.newbyteorder("<"), mode="r")
        self.vocab_size = vocab_size
        if len(self.tokens) <= FULL_SCAN_TOKENS:
            check_tokens(self.label, self.tokens, vocab_size)
        self.seed = seed

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        if len(self.tokens) <= length:
            raise DataOpenError(f"{self.label} holds {len(self.tokens)} tokens, fewer than seq_len + 1 ({length})")
        rng = np.random.default_rng(_seed_of(self.seed, step, index))
        start = int(rng.integers(0, len(self.tokens) - length))
        window = self.tokens[start : start + length]
        check_tokens(self.label, window, self.vocab_size, offset=start)  # a file too large to scan at open
        return torch.from_numpy(window.astype(np.int64))


TOKEN_DTYPES = ("uint16", "uint32")
# Files up to this many tokens are scanned whole at open (tens of ms from the page cache); a larger one is checked
# window by window as it is read, so a multi-GB corpus is not read through by every rank before the first step.
FULL_SCAN_TOKENS = 1 << 26


def recipe_dtype(label: str, recipe: dict) -> np.dtype:
    name = recipe.get("dtype", "uint16")
    if name not in TOKEN_DTYPES:
        raise DataOpenError(f"{label}: its recipe's dtype {name!r} is not one of {', '.join(TOKEN_DTYPES)}")
    return np.dtype(name)


def check_size(label: str, size: int, dtype: np.dtype) -> None:
    """A token file holds whole tokens of its dtype, at least one (np.memmap refuses an empty file)."""
    if size == 0:
        raise DataOpenError(f"{label} is empty (0 bytes); a token file holds at least seq_len + 1 tokens")
    if size % dtype.itemsize:
        raise DataOpenError(
            f"{label} is {size} bytes, not a multiple of {dtype.itemsize} (the size of one {dtype.name} token): "
            "the file is truncated or not a token file of that dtype (runner.corpus writes <stem>.json beside it)"
        )


def check_tokens(label: str, tokens: np.ndarray, vocab_size: int, offset: int | None = None) -> None:
    """Every token id is below vocab_size (an id beyond it fails the embedding lookup with a bare IndexError), for
    the whole file or one window of it (`offset`: where the window starts); skipped when the dtype cannot hold an
    id that large."""
    if len(tokens) == 0 or np.iinfo(tokens.dtype).max < vocab_size:
        return
    largest = int(tokens.max())
    if largest >= vocab_size:
        where = f" (in the window at token {offset})" if offset is not None else ""
        raise DataOpenError(
            f"{label} holds token id {largest}{where}, beyond the model's vocab_size ({vocab_size}: ids 0 to "
            f"{vocab_size - 1}); tokenize it with --vocab-size {vocab_size} or less, or use a model whose vocab "
            "covers it"
        )


class Batches:
    """Batch for (step, dp_rank): inputs and labels (local_batch_size, seq_len) int64 on the device."""

    def __init__(self, source, *, seq_len: int, local_batch_size: int, dp_rank: int, device: torch.device):
        self.source, self.seq_len, self.local_batch_size = source, seq_len, local_batch_size
        self.dp_rank, self.device = dp_rank, device

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.dp_rank * self.local_batch_size
        seqs = [self.source.sequence(step, first + j, self.seq_len + 1) for j in range(self.local_batch_size)]
        batch = torch.stack(seqs)
        if self.device.type == "cuda":
            # Pinned host memory lets the copy run asynchronously (no CPU-GPU sync point).
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]


HELD_OUT_SEED = 0  # held-out windows of a .val file: the same for every run and seed


def make_eval_batches(spec, vocab_size: int, dp_rank: int, device: torch.device) -> Batches:
    """Held-out batches: .get(b) for b in range(spec.eval_batches) is the b-th batch of every evaluation."""
    if spec.data_path:
        held_out_name = data_paths.beside(spec.data_path, ".val")
        held_out = resolve_data(held_out_name, spec.data_roots)
        source: MemmapTokens | HeldOutSynthetic = MemmapTokens(
            held_out, vocab_size, HELD_OUT_SEED, field="held-out split of data_path", name=held_out_name
        )
    else:
        source = HeldOutSynthetic(SyntheticTokens(vocab_size, spec.seed))
    return Batches(source, seq_len=spec.seq_len, local_batch_size=spec.local_batch_size, dp_rank=dp_rank, device=device)


class HeldOutSynthetic:
    """Sequences of the training chain that training never sees: eval batch b is step -(b + 1)."""

    def __init__(self, source: SyntheticTokens):
        self.source = source

    def sequence(self, step: int, index: int, length: int) -> torch.Tensor:
        return self.source.sequence(-(step + 1), index, length)


def make_batches(spec, vocab_size: int, dp_rank: int, device: torch.device) -> Batches:
    if spec.data_path:
        source: MemmapTokens | SyntheticTokens = MemmapTokens(
            resolve_data(spec.data_path, spec.data_roots), vocab_size, spec.seed, name=spec.data_path
        )
    else:
        source = SyntheticTokens(vocab_size, spec.seed)
    return Batches(source, seq_len=spec.seq_len, local_batch_size=spec.local_batch_size, dp_rank=dp_rank, device=device)
