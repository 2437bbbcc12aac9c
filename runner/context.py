"""Context parallel (cp=C+ layouts): C ranks share each sequence, and each block's attention gathers the keys and
values of the whole sequence (the all-gather form of context parallelism, as Llama 3 trained with).

The sequence is cut into 2C pieces and rank r holds pieces r and 2C - 1 - r, so every rank gets the same share of
the causal attention's work (an early piece attends to few keys, a late one to many). Everything but attention is
per token and runs on the rank's 2 pieces alone: embedding, norms, feed-forward, output and loss. In attention each
rank rotates its own queries and keys by their positions, gathers the keys and values of all ranks (autograd: their
gradients are reduced back in the backward), puts them in sequence order, and lets each of its two query pieces
attend to the keys up to its own end with a causal mask aligned to the lower right.

The ranks' losses are means over the same number of tokens, and their gradients are averaged by the data-parallel
wrapper over DP x CP ranks (runner.parallel.dp_mesh_of): the step updates the weights as one rank with the whole
sequences would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class ContextShard:
    """Rank `rank` of `size` context-parallel ranks over sequences of seq_len tokens (seq_len % (2 size) == 0)."""

    mesh: DeviceMesh  # the 1-D cp mesh
    rank: int
    size: int
    seq_len: int
    # gathered_attention, or under compiled blocks the same outside the graph (torch.compiler.disable): its gather
    # and two attention kernels gain nothing from inductor, and dynamo's shape guards over the causal-bias
    # subclass fail (IndexError in produce_guards)
    attend: Callable[..., torch.Tensor] | None = None

    @property
    def piece(self) -> int:
        return self.seq_len // (2 * self.size)

    @property
    def pieces(self) -> tuple[int, int]:
        return self.rank, 2 * self.size - 1 - self.rank

    def positions(self, device: torch.device) -> torch.Tensor:
        """Positions in the sequence of this rank's 2 pieces' tokens, in the order it holds them."""
        c = self.piece
        return torch.cat([torch.arange(p * c, (p + 1) * c, device=device) for p in self.pieces])

    def local(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's 2 pieces of a tensor that holds the whole sequences along `dim` (tokens, labels)."""
        c = self.piece
        return torch.cat([x.narrow(dim, p * c, c) for p in self.pieces], dim=dim)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gqa: bool) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequence's keys and values. q, k, v: (batch,
        heads, 2 pieces, head_dim) of this rank, positions already rotated in; returns q's shape."""
        return (self.attend or gathered_attention)(self, q, k, v, gqa)


def gathered_attention(
    shard: ContextShard, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool
) -> torch.Tensor:
    """ContextShard.attention. Imports inside: torch.nn.attention.bias loads dynamo (about 0.85 s of every rank's
    start)."""
    import torch.distributed._functional_collectives as funcol
    from torch.nn.attention.bias import causal_lower_right

    c, n = shard.piece, shard.size
    kv = torch.stack([k, v]).unsqueeze(0)  # (1, 2, batch, kv heads, 2c, head_dim)
    # All ranks' keys and values, gathered along the new first dim (its backward reduce-scatters the grads).
    # all_gather_single_autograd where torch has it (it deprecates all_gather_tensor_autograd; the same call)
    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    every = gather(kv, 0, shard.mesh.get_group())
    # piece p is the first half of rank p's for p < n, the second half of rank 2n - 1 - p's otherwise
    ordered = torch.cat(
        [every[p, ..., :c, :] if p < n else every[2 * n - 1 - p, ..., c:, :] for p in range(2 * n)], dim=-2
    )
    keys, values = ordered[0], ordered[1]
    out = []
    for i, p in enumerate(shard.pieces):
        end = (p + 1) * c  # the piece's queries see the keys up to its own last position
        out.append(
            F.scaled_dot_product_attention(
                q[..., i * c : (i + 1) * c, :],
                keys[..., :end, :],
                values[..., :end, :],
                attn_mask=causal_lower_right(c, end),
                enable_gqa=gqa,
            )
        )
    return torch.cat(out, dim=-2)


class LocalPieces:
    """A runner.data.Batches of whole sequences, cut to this rank's pieces (inputs and labels alike)."""

    def __init__(self, batches, shard: ContextShard):
        self.batches, self.shard = batches, shard

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = self.batches.get(step)
        return self.shard.local(inputs), self.shard.local(labels)


def context_shard(mesh: DeviceMesh, seq_len: int, *, compiled: bool = False) -> ContextShard:
    """This rank's shard of the "cp" dim of the run's mesh; compiled: the blocks will be compiled."""
    cp = mesh["cp"]
    attend = torch.compiler.disable(gathered_attention) if compiled else gathered_attention
    return ContextShard(mesh=cp, rank=cp.get_local_rank(), size=cp.size(), seq_len=seq_len, attend=attend)
