"""A small training script standing in for "the stack a team runs today" (a command engine's example).

It trains a one-block causal transformer on a learnable synthetic token stream with plain DDP (gloo on CPU,
NCCL on GPUs) and logs like Megatron-LM, one line per --log-interval steps, on rank 0:

     iteration        3/      20 | consumed samples:           12 | elapsed time per iteration (ms): 41.2 |
     learning rate: 1.000E-03 | global batch size:     4 | lm loss: 5.512345E+00 | grad norm: 1.234 |

so scalebench's `megatron-log` parser reads it; with --metrics-jsonl it also writes one JSON object per step
for the `jsonl` source. Start it with torchrun, as a command engine's argv does:

    torchrun --standalone --nproc-per-node 2 examples/own-stack/train.py --seq-length 64 --train-iters 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, seq_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        h = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        return self.out(self.norm(self.block(h, src_mask=mask, is_causal=True)))


def batch(gen: torch.Generator, vocab: int, size: int, seq_len: int) -> torch.Tensor:
    """Each token is the previous one plus a small random offset (mod vocab): learnable in a few steps."""
    start = torch.randint(0, vocab, (size, 1), generator=gen)
    steps = torch.randint(1, 4, (size, seq_len), generator=gen)
    return (start + steps.cumsum(1)) % vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--train-iters", type=int, default=20)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="autocast the forward pass to bf16")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--metrics-jsonl", default=None, help="also write one JSON object per step here")
    args = p.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    vocab = 256
    model = DistributedDataParallel(TinyLM(vocab, args.hidden_size, 4, args.seq_length).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    jsonl = open(args.metrics_jsonl, "w") if args.metrics_jsonl and rank == 0 else None  # noqa: SIM115 - whole run
    last = time.perf_counter()
    for it in range(1, args.train_iters + 1):
        tokens = batch(gen, vocab, args.micro_batch_size, args.seq_length + 1).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % args.log_interval:
            continue
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)  # the mean loss over ranks, as Megatron logs it
        if use_cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        step_ms = (now - last) * 1000.0 / args.log_interval
        last = now
        if rank == 0:
            mean = reduced.item() / world
            gbs = args.micro_batch_size * world
            print(
                f" iteration {it:8d}/{args.train_iters:8d} | consumed samples: {it * gbs:12d} | "
                f"elapsed time per iteration (ms): {step_ms:.1f} | learning rate: {args.lr:.3E} | "
                f"global batch size: {gbs:5d} | lm loss: {mean:.6E} | grad norm: {norm.item():.3f} |",
                flush=True,
            )
            if jsonl:
                jsonl.write(json.dumps({"step": it, "step_ms": step_ms, "loss": mean}) + "\n")
                jsonl.flush()
    if jsonl:
        jsonl.close()
    dist.barrier()  # every rank is done before any leaves
    sys.stdout.flush()
    # gloo's teardown can abort a rank after a successful run ("terminate called without an active exception",
    # SIGABRT from its threads, seen here under Slurm): leave without it, as scalebench's own runner does.
    os._exit(0)


if __name__ == "__main__":
    main()
