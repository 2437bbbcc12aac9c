"""Pipeline stages' compute on one GPU: how long each stage of a split takes a micro-batch, and whether the split
that weighs the output layer by its FLOPs (ModelShape.pipeline_split, the runner's) beats the even one.

    python3 bench/pp_stage_gpu.py [--model 8b --layers 32 --seq-len 8192 --pps 2 4 8 --precisions bf16 fp8-tensorwise]

A 1F1B pipeline's steady state runs at its slowest stage, so the stage times of a split, not the whole model's,
set its step. For each P this times, on one GPU and without a process group, every distinct stage of two splits:
`even` (L // P blocks each, one more on the first L % P stages) and `weighted` (the runner's, which weighs the
output layer by ModelShape.output_weight: its FLOPs, scaled under --compile). A stage is the
runner's model (runner.model.Llama) cut as runner.parallel.keep_stage cuts it: the first holds the embedding, the
last the final norm, the output layer and the fp32 cross-entropy (compiled under --compile, as the runner compiles
its loss; the final norm and the output layer stay eager there too); its parameters are bf16 (as FSDP's mixed
precision gathers them), fp8 recipes convert its linears as the runner does (runner.fp8.apply_float8). One
micro-batch of one sequence, forward + backward (no optimizer step, no sends): the first stage takes tokens, the
others a hidden state, and a stage before the last back-propagates a fixed gradient.

Prints per precision and P: each split's stage times, the slowest, the measured imbalance P x slowest / sum (what
core.projection.step_model.Workload.stage_compute_factor models) and the weighted split's speed-up of
the slowest stage; then the output layer's measured cost in blocks (last stage less a middle stage of the same
blocks, over one block) against ModelShape.output_cost_in_blocks.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.common import median_ms as timed  # noqa: E402
from core.catalog.shapes import get_shape  # noqa: E402
from core.projection.step_model import Workload, stage_factors  # noqa: E402
from runner.fp8 import apply_float8, is_fp8  # noqa: E402
from runner.model import Llama, init_weights  # noqa: E402
from runner.train import cross_entropy_fp32  # noqa: E402


def even_split(layers: int, pp: int) -> tuple[int, ...]:
    per, extra = divmod(layers, pp)
    return tuple(per + (1 if s < extra else 0) for s in range(pp))


def kind(stage: int, pp: int) -> str:
    return "first" if stage == 0 else ("last" if stage == pp - 1 else "middle")


def device() -> torch.device:
    """The GPU; the CPU only for a smoke run of this script (--model debug)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def stage_ms(args, precision: str, where: str, blocks: int) -> float:
    """Forward + backward ms of one micro-batch through a stage of `blocks` blocks at position `where`."""
    dev, s = device(), args.seq_len
    shape = dataclasses.replace(get_shape(args.model, args.layers), num_layers=blocks)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(shape, max_seq_len=s)
    if where != "first":
        model.tok_embeddings = None
    if where != "last":
        model.norm = model.output = None
    model.to_empty(device=dev)
    init_weights(model, seed=0)
    model.to(torch.bfloat16)
    if is_fp8(precision):
        apply_float8(model, precision, emulate=dev.type == "cpu", fp8_all_gather=False)
    if args.compile:
        for name, block in model.layers.items():
            model.layers[name] = torch.compile(block, fullgraph=True)  # as runner.parallel.apply_compile
    loss_fn = torch.compile(cross_entropy_fp32) if args.compile else cross_entropy_fp32  # as runner.train.run
    gen = torch.Generator(device=dev).manual_seed(0)
    tokens = torch.randint(0, shape.vocab_size, (1, s), device=dev, generator=gen)
    hidden = torch.randn(1, s, shape.dim, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    grad = torch.randn(1, s, shape.dim, device=dev, dtype=torch.bfloat16, generator=gen)

    def step() -> None:
        out = model(tokens if where == "first" else hidden)
        if where == "last":
            loss_fn(out, tokens).backward()
        else:
            out.backward(grad)

    return timed(step, args.repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="8b")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--pps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp8-tensorwise"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile each block, as a run with compile")
    args = ap.parse_args()
    started = time.perf_counter()
    shape = get_shape(args.model, args.layers)
    out_flops = shape.output_cost_in_blocks(args.seq_len)
    name = torch.cuda.get_device_name() if device().type == "cuda" else "CPU"
    print(
        f"{name}; torch {torch.__version__}; Python {platform.python_version()}; "
        f"{args.model} x{args.layers} blocks, seq {args.seq_len}, micro-batch 1, "
        f"{'compiled blocks' if args.compile else 'eager'}, median of {args.repeats}"
    )
    for precision in args.precisions:
        cache: dict[tuple[str, int], float] = {}

        def t(where: str, blocks: int, precision=precision, cache=cache) -> float:
            if (where, blocks) not in cache:
                cache[(where, blocks)] = stage_ms(args, precision, where, blocks)
                if device().type == "cuda":
                    torch.cuda.empty_cache()  # the stage's memory, freed on return
            return cache[(where, blocks)]

        print(f"\n{precision}")
        print("| P | split | blocks per stage | stage ms, first to last | slowest, ms | measured P x slowest / sum "
              "| modelled | slowest: even / weighted |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for pp in args.pps:
            weighted = shape.pipeline_split(pp, args.seq_len, compiled=args.compile)  # the runner's
            splits = {"even": even_split(args.layers, pp), "weighted": weighted}
            slowest = {}
            for name, split in splits.items():
                times = [t(kind(i, pp), b) for i, b in enumerate(split)]
                slowest[name] = max(times)
                modelled = max(stage_factors(split, shape.output_weight(args.seq_len, compiled=args.compile)))
                if name == "weighted":  # the projection's own figure for the runner's split
                    w = Workload(model=args.model, num_layers=args.layers, precision=precision, compile=args.compile,
                                 layout=f"pp={pp}+fsdp", seq_len=args.seq_len, local_batch_size=pp)  # fmt: skip
                    modelled = w.stage_compute_factor(pp)
                ratio = f"{slowest['even'] / slowest['weighted']:.3f}" if name == "weighted" else ""
                print(
                    f"| {pp} | {name} | {'/'.join(map(str, split))} | {' / '.join(f'{x:.1f}' for x in times)} "
                    f"| {max(times):.1f} | {pp * max(times) / sum(times):.3f} | {modelled:.3f} | {ratio} |"
                )
        middles = sorted(b for (where, b) in cache if where == "middle" and ("last", b) in cache)
        for b in middles:
            per_block = cache[("middle", b)] / b
            print(
                f"output layer + loss, measured: last({b}) - middle({b}) = "
                f"{cache[('last', b)] - cache[('middle', b)]:.1f} ms = "
                f"{(cache[('last', b)] - cache[('middle', b)]) / per_block:.2f} blocks "
                f"(FLOPs: {out_flops:.2f}); a block {per_block:.1f} ms"
            )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
