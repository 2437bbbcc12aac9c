"""A plain PyTorch Llama-3 (RMSNorm, RoPE theta 500000, GQA, SwiGLU, causal SDPA) built from core.catalog.shapes.

Shapes come from `core.catalog.shapes.ModelShape`. Attention and feed-forward infer their local head count from
the projected tensor's width, so the same code runs unsharded and under tensor parallelism (where wq/wk/wv
hold num_heads / tp heads per rank). Build on the meta device, then `to_empty` and `init_weights`.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from core.catalog.shapes import ModelShape
from runner.context import ContextShard

# GQA inside SDPA (enable_gqa: the kernel reads each kv head for its query heads) instead of repeating k and v to
# the query head count first (a copy of both in the forward, a reduction of their gradients in the backward, and
# the repeated tensors saved for the backward). TorchTitan does the same. A switch for the GPU bench's A/B runs.
SDPA_GQA = True


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize and scale in fp32 (bf16 sums of squares lose ~3 digits); return the input dtype, also
        # under autocast where the weight stays fp32 (a promoted fp32 output would break torchao's
        # high-precision grad-weight GEMM, which needs activations and gradients in one dtype).
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).type_as(x)


def rope_cos_sin(head_dim: int, seq_len: int, theta: float, device: torch.device | str) -> torch.Tensor:
    """(2, seq_len, head_dim // 2) fp32: cos and sin of the rotary angles (Llama-3, no scaling)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: (bs, seq, heads, head_dim); rotates interleaved pairs (the Llama reference's complex layout)."""
    cos, sin = rope[0][None, :, None, :], rope[1][None, :, None, :]
    xf = x.float().unflatten(-1, (-1, 2))
    real, imag = xf[..., 0], xf[..., 1]
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.head_dim = shape.head_dim
        self.num_rep = shape.num_heads // shape.num_kv_heads  # GQA: query heads per kv head
        kv_dim = shape.num_kv_heads * shape.head_dim
        self.wq = nn.Linear(shape.dim, shape.num_heads * shape.head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, kv_dim, bias=False)
        self.wv = nn.Linear(shape.dim, kv_dim, bias=False)
        self.wo = nn.Linear(shape.num_heads * shape.head_dim, shape.dim, bias=False)
        # Set by runner.parallel.apply_cp under context parallelism: attention over the ranks' gathered keys.
        self.context: ContextShard | None = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        # -1: the local head count (num_heads / tp under tensor parallelism).
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (bs, heads, seq, head_dim)
        gqa = self.num_rep > 1
        if gqa and not SDPA_GQA:
            k = k.repeat_interleave(self.num_rep, dim=1)
            v = v.repeat_interleave(self.num_rep, dim=1)
        if self.context is not None:
            out = self.context.attention(q, k, v, gqa=gqa and SDPA_GQA)
        else:  # cuDNN/flash kernel on CUDA
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa and SDPA_GQA)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        hidden = shape.ffn_hidden_dim
        self.w1 = nn.Linear(shape.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, shape.dim, bias=False)
        self.w3 = nn.Linear(shape.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class Block(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.attention_norm = RMSNorm(shape.dim, shape.norm_eps)
        self.attention = Attention(shape)
        self.ffn_norm = RMSNorm(shape.dim, shape.norm_eps)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    rope: torch.Tensor  # (2, max_seq_len, head_dim // 2) cos and sin, a buffer registered in __init__

    def __init__(self, shape: ModelShape, max_seq_len: int):
        super().__init__()
        self.shape = shape
        self.max_seq_len = max_seq_len
        # Optional: a pipeline stage (runner.parallel.keep_stage) drops the embedding before its first stage and the
        # norm and output after its last.
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.vocab_size, shape.dim)
        # Keyed by the block's index in the whole model, so a pipeline stage keeps the parameter names (and the
        # seeded init, init_parameters) of the unsplit model: layers.<i>.…
        self.layers = nn.ModuleDict({str(i): Block(shape) for i in range(shape.num_layers)})
        self.norm: RMSNorm | None = RMSNorm(shape.dim, shape.norm_eps)
        self.output: nn.Linear | None = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        # Not a parameter and not persistent: recomputed by init_weights after to_empty.
        self.register_buffer("rope", torch.empty(2, max_seq_len, shape.head_dim // 2), persistent=False)
        # Set by runner.parallel.apply_cp: this rank's pieces of each sequence (their positions pick the rotation).
        self.context: ContextShard | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (bs, seq) int64 -> logits (bs, seq, vocab). A pipeline stage without the embedding takes the
        previous stage's hidden states (bs, seq, dim) instead, and one without the output returns its own."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if torch.is_autocast_enabled(h.device.type):
            # Residual stream in the autocast dtype (as FSDP's bf16 params give): torchao's Float8Linear
            # (rowwise_with_gw_hp) multiplies activations with their gradients and needs one dtype.
            h = h.to(torch.get_autocast_dtype(h.device.type))
        if self.context is not None:  # this rank's pieces of the sequence, at their positions
            rope = self.rope[:, self.context.positions(self.rope.device)]
        elif self.tok_embeddings is not None:
            rope = self.rope[:, : tokens.shape[1]]
        else:  # hidden states under sequence-parallel TP hold a shard of the sequence; attention rotates all of it
            rope = self.rope
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def _param_seed(seed: int, name: str) -> int:
    # Stable across processes (Python's hash() is salted): one stream per parameter name.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_distribution(name: str, shape: ModelShape) -> tuple[float, float] | None:
    """(std, truncation bound in absolute value) of a parameter's normal draw; None: RMSNorm weight, set to one.

    TorchTitan 0.2.2's llama3 scheme (Transformer.init_weights), so that both engines start from the same
    distribution: token embeddings N(0, 1); wq, wk, wv and w1 std 0.02; the depth-scaled wo, w2 and w3 std
    0.02 / sqrt(2 (layer + 1)) (its depth_init); these truncated at +-2 (absolute, as its trunc_normal_ default);
    the output projection std dim^-1/2 truncated at 3 std."""
    if name.endswith("norm.weight"):
        return None
    if name.startswith("tok_embeddings"):
        return 1.0, math.inf
    if name.startswith("output"):
        std = shape.dim**-0.5
        return std, 3 * std
    if name.endswith(("wo.weight", "w2.weight", "w3.weight")):
        layer_id = int(name.split(".")[1])  # layers.<i>.…
        return 0.02 / (2 * (layer_id + 1)) ** 0.5, 2.0
    return 0.02, 2.0


def _strip_wrappers(name: str) -> str:
    # Activation-checkpoint and compile wrappers add path components; the init must not depend on them.
    for part in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name


@torch.no_grad()
def init_parameters(module: nn.Module, shape: ModelShape, seed: int) -> None:
    """Draw every parameter of a Llama-3 module (ours, or TorchTitan's llama3 Transformer: the same parameter
    names) from a per-name seeded stream (init_distribution), independent of how it is sharded.

    Each rank draws the full tensor and keeps its own shard (DTensor.redistribute from Replicate is a
    local slice, no communication), so FSDP, TP and a single process start from identical weights and
    their losses can be compared. Cost: one full-size temporary per parameter on each rank.
    """
    from torch.distributed.tensor import DTensor, Replicate

    for raw_name, param in module.named_parameters():
        name = _strip_wrappers(raw_name)
        dist = init_distribution(name, shape)
        gen = torch.Generator(device=param.device).manual_seed(_param_seed(seed, name))
        full = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        if dist is None:
            full.fill_(1.0)
        elif math.isinf(dist[1]):
            full.normal_(0.0, dist[0], generator=gen)
        else:
            std, bound = dist
            nn.init.trunc_normal_(full, mean=0.0, std=std, a=-bound, b=bound, generator=gen)
        if isinstance(param, DTensor):
            rep = DTensor.from_local(full, param.device_mesh, [Replicate()] * param.device_mesh.ndim, run_check=False)
            local = rep.redistribute(param.device_mesh, param.placements).to_local()
            param.to_local().copy_(local.to(param.dtype))
        else:
            param.copy_(full)


@torch.no_grad()
def init_weights(model: Llama, seed: int) -> None:
    """init_parameters, then the RoPE table (a buffer)."""
    init_parameters(model, model.shape, seed)
    model.rope.copy_(rope_cos_sin(model.shape.head_dim, model.max_seq_len, model.shape.rope_theta, model.rope.device))
