"""Local inputs for the TorchTitan side of the peer bench, made at run time so that nothing is downloaded.

- an English-like text corpus (seeded word salad with Zipf-weighted words and simple sentence shapes) written in
  TorchTitan's c4_test layout: one directory holding a JSON-lines file of {"text", "timestamp", "url"} records,
  read by `load_dataset(<dir>, split="train")`;
- a byte-level BPE tokenizer trained on that corpus with the `tokenizers` library (tokenizer.json plus a
  tokenizer_config.json naming the BOS and EOS tokens, as TorchTitan's HuggingFaceTokenizer reads them).

Throughput does not depend on the text; the corpus only has to be long enough for the steps run (TorchTitan
re-loops it otherwise) and the token ids have to stay below the model's vocabulary (128256).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

NOUNS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
]
VERBS = [
    "is",
    "was",
    "has",
    "had",
    "does",
    "said",
    "made",
    "went",
    "took",
    "came",
    "saw",
    "knew",
    "got",
    "gave",
    "found",
    "thought",
    "told",
    "became",
    "showed",
    "left",
    "felt",
    "brought",
    "began",
    "kept",
    "held",
    "wrote",
    "stood",
    "heard",
    "meant",
    "met",
    "ran",
    "paid",
    "sat",
    "spoke",
    "led",
    "read",
    "grew",
    "lost",
    "fell",
    "sent",
    "built",
    "understood",
    "drew",
    "broke",
    "spent",
    "cut",
    "rose",
    "drove",
    "bought",
    "wore",
    "chose",
]
ADJS = [
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "right",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "late",
    "hard",
    "major",
    "better",
    "economic",
    "strong",
    "possible",
    "whole",
    "free",
    "military",
    "true",
    "federal",
    "international",
    "full",
    "special",
    "easy",
    "clear",
    "recent",
    "certain",
    "personal",
    "open",
    "red",
    "difficult",
    "available",
    "likely",
]
GLUE = (
    ["the", "the", "the", "a", "a", "an", "this", "that", "every", "some", "its", "their", "our"],
    [
        "in",
        "on",
        "at",
        "for",
        "with",
        "from",
        "about",
        "into",
        "over",
        "after",
        "under",
        "between",
        "through",
        "during",
        "without",
    ],
    ["and", "but", "so", "because", "while", "although", "when", "if"],
)


def _zipf_cum_weights(n: int) -> list[float]:
    # rank r drawn with weight 1/r (a Zipf-like word frequency, as in natural text)
    cum, total = [], 0.0
    for rank in range(1, n + 1):
        total += 1.0 / rank
        cum.append(total)
    return cum


_CUM = {id(words): _zipf_cum_weights(len(words)) for words in (NOUNS, VERBS, ADJS)}


def _zipf_choice(rng: random.Random, words: list[str]) -> str:
    return rng.choices(words, cum_weights=_CUM[id(words)])[0]


def _sentence(rng: random.Random) -> str:
    det, prep, conj = GLUE
    parts = [
        rng.choice(det),
        _zipf_choice(rng, ADJS),
        _zipf_choice(rng, NOUNS),
        _zipf_choice(rng, VERBS),
        rng.choice(det),
        _zipf_choice(rng, NOUNS),
    ]
    if rng.random() < 0.6:
        parts += [rng.choice(prep), rng.choice(det), _zipf_choice(rng, NOUNS)]
    if rng.random() < 0.3:
        parts += [rng.choice(conj), rng.choice(det), _zipf_choice(rng, NOUNS), _zipf_choice(rng, VERBS)]
    text = " ".join(parts)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", "?"))


def write_corpus(directory: Path, num_docs: int, seed: int = 0) -> Path:
    """num_docs documents of 20-80 sentences each (about 300 words per document on average)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "data.json"  # as TorchTitan's tests/assets/c4_test (a name with "test" in it would
    # make datasets call the split "test"; TorchTitan loads split="train")
    with path.open("w") as f:
        for i in range(num_docs):
            text = " ".join(_sentence(rng) for _ in range(rng.randint(20, 80)))
            f.write(
                json.dumps(
                    {"text": text, "timestamp": "2026-12-03T00:00:00Z", "url": f"https://example.invalid/doc/{i}"}
                )
                + "\n"
            )
    return path


def write_tokenizer(directory: Path, corpus: Path, vocab_size: int = 4096) -> Path:
    """Train a byte-level BPE on the corpus; writes tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )

    def texts():
        with corpus.open() as f:
            for line in f:
                yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False})
    )
    return directory


def make_assets(root: Path, num_docs: int = 1500, seed: int = 0) -> dict[str, Path]:
    """The corpus directory and the tokenizer directory under root (made once, reused if present)."""
    data_dir, tok_dir = root / "c4_test", root / "tokenizer"
    if not (data_dir / "data.json").exists():
        write_corpus(data_dir, num_docs, seed)
    if not (tok_dir / "tokenizer.json").exists():
        write_tokenizer(tok_dir, data_dir / "data.json")
    return {"dataset_path": data_dir, "hf_assets_path": tok_dir}
