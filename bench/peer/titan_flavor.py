"""TorchTitan train spec for the peer bench: Llama-3-8B dimensions at a chosen depth, registered from outside.

TorchTitan imports this module through `--experimental.custom_import bench.peer.titan_flavor` (its extension
point for user code) before it builds the model; nothing in TorchTitan is edited. The spec is TorchTitan's own
llama3 spec (its Transformer, parallelize_llama with per-block compile, AdamW, c4_test loader, HF tokenizer)
with one table of flavors: Llama-3-8B's dimensions (core.shapes "8b": dim 4096, 32 heads, 8 kv heads, FFN
14336, vocab 128256, RoPE theta 500000) at 16 layers (the bench shape), and at 4 and 2 layers; plus a tiny
"debug" flavor for the CPU smoke run. Model name: scalebench_llama3; flavors 8B_16L, 8B_4L, 8B_2L, debug.
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec
from torchtitan.protocols.train_spec import register_train_spec

MODEL_NAME = "scalebench_llama3"


def llama3_8b_args(num_layers: int) -> TransformerModelArgs:
    # TorchTitan's "8B" flavor with n_layers replaced (same fields as torchtitan.models.llama3.llama3_args["8B"]).
    return TransformerModelArgs(dim=4096, n_layers=num_layers, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
                                multiple_of=1024, rope_theta=500000)


FLAVORS = {f"8B_{n}L": llama3_8b_args(n) for n in (16, 4, 2)}
# CPU smoke only: vocab 4096 covers the bench tokenizer (bench/peer/assets.py trains at most 4096 tokens).
FLAVORS["debug"] = TransformerModelArgs(dim=256, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=4096,
                                        rope_theta=500000)

register_train_spec(MODEL_NAME, dataclasses.replace(get_train_spec(), model_args=FLAVORS))
