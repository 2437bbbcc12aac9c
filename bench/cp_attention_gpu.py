"""Context parallel's attention kernels on one GPU: which SDPA backend the runner's gathered attention gets, and
what it costs against the unsplit causal attention.

    python3 bench/cp_attention_gpu.py [--seq-len 8192] [--cps 2 4]

runner.context.gathered_attention lets each of a rank's two query pieces (seq / 2C tokens) attend to the gathered
keys up to the piece's end with torch.nn.attention.bias.causal_lower_right and enable_gqa (Llama-3 8B heads: 32
query, 8 key/value, head dim 128, bf16). This runs those SDPA calls for every rank of C = 2, 4 on one GPU (no
process group: the gathered keys are the whole sequence's) and prints per rank: whether flash attention accepts
the call (sdpa_kernel(FLASH_ATTENTION) alone), the largest difference from the unsplit causal attention's rows of
the same queries, and the forward + backward time of the rank's two calls against the unsplit attention's / C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms as timed  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--cps", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    dev, s = torch.device("cuda"), args.seq_len
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, HEADS, s, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    k = torch.randn(1, KV_HEADS, s, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    v = torch.randn(1, KV_HEADS, s, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).detach()

    def unsplit() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

    full_ms = timed(unsplit)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; seq {s}, heads {HEADS}/{KV_HEADS} x {HEAD_DIM}")
    print(f"unsplit causal attention, forward + backward: {full_ms:.2f} ms")
    print("| C | rank | pieces | flash accepts | max abs diff vs unsplit | rank's fwd + bwd, ms | unsplit / C, ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for cp in args.cps:
        c = s // (2 * cp)
        for rank in range(cp):
            pieces = (rank, 2 * cp - 1 - rank)

            def calls(backend: SDPBackend | None = None, pieces=pieces, c=c) -> list[torch.Tensor]:
                outs = []
                for p in pieces:
                    end = (p + 1) * c
                    qp, kp, vp = q[..., p * c : end, :], k[..., :end, :], v[..., :end, :]
                    mask = causal_lower_right(c, end)
                    if backend is None:
                        outs.append(F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True))
                    else:
                        with sdpa_kernel([backend]):
                            outs.append(F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=True))
                return outs

            try:
                calls(SDPBackend.FLASH_ATTENTION)
                flash = "yes"
            except RuntimeError as exc:
                flash = f"no ({str(exc).splitlines()[0][:60]})"
            outs = calls()
            diff = max(
                (o.detach().float() - full[..., p * c : (p + 1) * c, :].float()).abs().max().item()
                for o, p in zip(outs, pieces)
            )
            ms = timed(lambda calls=calls: sum(o.sum() for o in calls()).backward())
            print(f"| {cp} | {rank} | {pieces} | {flash} | {diff:.2e} | {ms:.2f} | {full_ms / cp:.2f} |")


if __name__ == "__main__":
    main()
