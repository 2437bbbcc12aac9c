"""Named Llama-3 shapes and the FLOPs-per-token formula (one home for both).

Shapes are the published Llama-3 / 3.1 / 3.2 configurations (params.json of the released checkpoints);
`debug` is a tiny shape for CPU tests and the demo.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MODEL_NAMES = ("debug", "1b", "8b", "70b", "405b")

# The output layer (eager, bf16 under every recipe) and the compiled fp32 loss over their FLOP weight in blocks when
# the blocks are compiled: 2.43-2.51 blocks' time against 1.84 blocks' FLOPs for fp8-tensorwise (Llama-3 8B, 8,192
# tokens, one H100); bf16 1.94-1.96, fp8-rowwise 2.02-2.04, rowwise-gw-hp 2.14-2.21. Eager bf16 the FLOP weight
# holds (1.96-2.07). 8B's compiled split is the same from 2.0 to 3.0 blocks and, from the measured stage times,
# the faster of it and the eager split for each recipe (bf16: a tie).
# bench/pp_stage_gpu.py, bench/results/2026-12-05-h100-stages-and-service.md.
COMPILED_OUTPUT_SCALE = 1.36


@dataclass(frozen=True)
class ModelShape:
    name: str
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    ffn_dim_multiplier: float | None
    multiple_of: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def ffn_hidden_dim(self) -> int:
        # Llama-3 FeedForward sizing (reference model.py): 2/3 of 4*dim, scaled, rounded up to multiple_of.
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def tp_reason(self, tp: int, **dims: int) -> str | None:
        """Why tensor parallel degree tp cannot split this model's heads and key/value heads (every TP stack splits
        them whole), or the further dims given (a runner's own splits), or None."""
        if tp == 1:
            return None
        sizes = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, **dims}
        bad = [f"{k}({v})" for k, v in sizes.items() if v % tp]
        return f"tp degree {tp} does not divide {', '.join(bad)}" if bad else None

    def num_params(self, include_embedding: bool = True) -> int:
        """Parameter count of the plain model (untied embedding and output, RMSNorm weights)."""
        d, h = self.dim, self.ffn_hidden_dim
        kv_dim = self.num_kv_heads * self.head_dim
        attn = d * d + 2 * d * kv_dim + d * d  # wq, wk, wv, wo
        ffn = 3 * d * h  # w1, w2, w3
        per_layer = attn + ffn + 2 * d  # two RMSNorm weights
        total = self.num_layers * per_layer + d + self.vocab_size * d  # final norm + output
        if include_embedding:
            total += self.vocab_size * d
        return total

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (torchtitan `get_num_flop_per_token`, PaLM appendix B).

        6 * N (N = params without the token embedding) for the dense matmuls forward and backward,
        plus 12 * L * H * head_dim * T for the attention score and value products.
        """
        n = self.num_params(include_embedding=False)
        return 6 * n + 12 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def output_cost_in_blocks(self, seq_len: int) -> float:
        """The output layer's training FLOPs per token (6 V d) over one transformer block's (its linears' 6 x params
        plus its attention's 12 H head_dim T): 1.84 blocks for 8b at 8,192 tokens, 0.6 for 405b."""
        d, kv = self.dim, self.num_kv_heads * self.head_dim
        linears = 2 * d * d + 2 * d * kv + 3 * d * self.ffn_hidden_dim
        return 6 * self.vocab_size * d / (6 * linears + 12 * self.num_heads * self.head_dim * seq_len)

    def output_weight(self, seq_len: int, compiled: bool = False) -> float:
        """The last stage's output layer and loss in blocks' time: their FLOPs (`output_cost_in_blocks`), times
        COMPILED_OUTPUT_SCALE where the blocks and the loss are compiled and the output layer is not."""
        return self.output_cost_in_blocks(seq_len) * (COMPILED_OUTPUT_SCALE if compiled else 1.0)

    def pipeline_split(self, pp: int, seq_len: int, compiled: bool = False) -> tuple[int, ...]:
        """Blocks per pipeline stage, first to last: contiguous, at least one each, weighed by time so that the
        slowest stage is as fast as it can be. The last stage also runs the output layer and the loss
        (`output_weight`), so it takes fewer blocks; the first stage's embedding is a lookup, weighed 0.
        Of equally fast splits, the one with the most blocks on the last stage (the earlier stages of a 1F1B
        schedule hold more micro-batches' activations). The others share the rest evenly, larger ones first.
        Needs 1 <= pp <= num_layers."""
        layers = self.num_layers
        if not 1 <= pp <= layers:
            raise ValueError(f"pp: needs 1 <= pp <= num_layers ({layers}), got {pp}")
        if pp == 1:
            return (layers,)
        out_cost = self.output_weight(seq_len, compiled)

        def slowest(last: int) -> float:
            return max(-(-(layers - last) // (pp - 1)), last + out_cost)

        last = min(range(layers - pp + 1, 0, -1), key=slowest)  # min keeps the first (largest) of equal ones
        per, extra = divmod(layers - last, pp - 1)
        return tuple(per + (1 if s < extra else 0) for s in range(pp - 1)) + (last,)


SHAPES: dict[str, ModelShape] = {
    "debug": ModelShape(
        "debug",
        dim=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        vocab_size=2048,
        ffn_dim_multiplier=None,
        multiple_of=256,
    ),
    # Llama-3.2-1B
    "1b": ModelShape(
        "1b",
        dim=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        vocab_size=128256,
        ffn_dim_multiplier=1.5,
        multiple_of=256,
    ),
    # Llama-3.1-8B
    "8b": ModelShape(
        "8b",
        dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        vocab_size=128256,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
    ),
    # Llama-3.1-70B
    "70b": ModelShape(
        "70b",
        dim=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        vocab_size=128256,
        ffn_dim_multiplier=1.3,
        multiple_of=4096,
    ),
    # Llama-3.1-405B
    "405b": ModelShape(
        "405b",
        dim=16384,
        num_layers=126,
        num_heads=128,
        num_kv_heads=8,
        vocab_size=128256,
        ffn_dim_multiplier=1.2,
        multiple_of=4096,
    ),
}


def get_shape(name: str, num_layers: int | None = None, vocab_size: int | None = None) -> ModelShape:
    """A named shape, with its layer count and vocabulary (a tokenizer's) overridden when given."""
    if name not in SHAPES:
        raise ValueError(f"model: unknown shape {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    shape = SHAPES[name]
    shape = replace(shape, num_layers=num_layers) if num_layers else shape
    return replace(shape, vocab_size=vocab_size) if vocab_size else shape
