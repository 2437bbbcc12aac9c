"""GPU bench of the runner against a minimal reference loop, and an fp8-vs-bf16 loss check.

    PYTHONUNBUFFERED=1 python bench/gpu_runner.py --out $OUT          # on the H200 (one process, one GPU)
    python bench/gpu_runner.py --smoke                                # on CPU: tiny shape, checks the script

Throughput: Llama-3-8B shape with 16 layers, 1 x 8192 tokens per step, torch.compile per block, for bf16 and
the three torchao float8 recipes, (a) through our runner (runner.train.run, in-process, world size 1) and
(b) through a self-contained reference loop defined in this file (its own minimal Llama, fp32 master weights
under bf16 autocast, torchao convert_to_float8_training, torch.compile per block, clip_grad_norm_, fused
AdamW; none of runner/). Both time steps with CUDA events and take the median after warm-up.
Loss check: 4 layers, 200 steps, LR warm-up, through our runner; each fp8 recipe's mean loss over the last 50
steps against bf16's. The table is printed last; JSON lines of every measurement go to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.catalog.hardware import peak_tflops  # noqa: E402
from core.catalog.shapes import get_shape  # noqa: E402
from core.contracts.specs import RunSpec, resolve_layout  # noqa: E402

log = logging.getLogger("bench")
RECIPES = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp")
GIB = 1024**3


# ------------------------------------------------------------------------------ the reference model


class RefBlock(nn.Module):
    """Llama-3 block in the fewest lines: RMSNorm, RoPE, GQA causal SDPA, SwiGLU."""

    def __init__(self, dim, n_heads, n_kv, hidden, eps):
        super().__init__()
        self.n_heads, self.n_kv, self.hd, self.eps = n_heads, n_kv, dim // n_heads, eps
        self.wq = nn.Linear(dim, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(dim, n_kv * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.n1 = nn.Parameter(torch.ones(dim))
        self.n2 = nn.Parameter(torch.ones(dim))

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = F.rms_norm(x, (x.shape[-1],), self.n1, self.eps).to(x.dtype)  # autocast may return fp32
        q = self.wq(h).view(b, s, self.n_heads, self.hd)
        k = self.wk(h).view(b, s, self.n_kv, self.hd)
        v = self.wv(h).view(b, s, self.n_kv, self.hd)

        def rope(t):
            t2 = t.float().unflatten(-1, (-1, 2))
            re, im = t2[..., 0], t2[..., 1]
            return torch.stack([re * cos - im * sin, re * sin + im * cos], -1).flatten(-2).type_as(t)

        q, k = rope(q).transpose(1, 2), rope(k).transpose(1, 2)
        rep = self.n_heads // self.n_kv  # GQA by repeating kv heads, as runner/model.py does
        k, v = k.repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = F.rms_norm(x, (x.shape[-1],), self.n2, self.eps).to(x.dtype)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class RefModel(nn.Module):
    def __init__(self, shape, seq_len):
        super().__init__()
        self.emb = nn.Embedding(shape.vocab_size, shape.dim)
        self.blocks = nn.ModuleList(
            RefBlock(shape.dim, shape.num_heads, shape.num_kv_heads, shape.ffn_hidden_dim, shape.norm_eps)
            for _ in range(shape.num_layers)
        )
        self.norm = nn.Parameter(torch.ones(shape.dim))
        self.out = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        hd = shape.dim // shape.num_heads
        freqs = 1.0 / (shape.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq_len).float(), freqs)[None, :, None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.bfloat16)  # one activation dtype for torchao's high-precision grad-weight GEMM
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        return self.out(F.rms_norm(x, (x.shape[-1],), self.norm).to(x.dtype))


def reference_run(shape, precision, seq_len, steps, warmup, device, compile_blocks):
    """The minimal loop. Returns dict(tokens_per_sec, step_ms, peak_gib, losses)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    with torch.device(device):
        model = RefModel(shape, seq_len)
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    if precision != "bf16":
        name = {"fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp"}[
            precision
        ]
        import dataclasses

        cfg = dataclasses.replace(Float8LinearConfig.from_recipe_name(name), emulate=device.type == "cpu")
        convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn != "out")
    if compile_blocks:
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, shape.vocab_size, (1, seq_len + 1), generator=gen).to(device) for _ in range(4)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(steps):
        batch = batches[step % 4]
        start = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if start:
            start.record()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if start:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            times.append((start, end))
        else:
            times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in times]
        peak = torch.cuda.max_memory_allocated() / GIB
    else:
        ms, peak = [t * 1000 for t in times], None
    med = statistics.median(ms[warmup:])
    del model, opt
    return {
        "tokens_per_sec": seq_len / (med / 1000),
        "step_ms": med,
        "peak_gib": peak,
        "losses": [float(x) for x in losses],
    }


# ------------------------------------------------------------------------------------------ ours


def runner_spec(precision, *, num_layers, seq_len, steps, warmup, compile_blocks, device_type, lr_warmup=0, model="8b"):
    return RunSpec(
        model=model,
        num_layers=num_layers,
        precision=precision,
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=seq_len,
        local_batch_size=1,
        steps=steps,
        warmup_steps=warmup,
        compile=compile_blocks,
        lr=3e-4,
        lr_warmup_steps=lr_warmup,
        device_type=device_type,
    )


def ours_run(spec):
    from runner.train import run

    result = run(spec)
    if result.status != "succeeded":
        raise RuntimeError(f"runner failed: {result.error.kind}: {result.error.message[:2000]}")
    s = result.summary
    return {
        "tokens_per_sec": s.tokens_per_sec,
        "step_ms": s.step_ms_median,
        "peak_gib": s.peak_memory_allocated_gib,
        "mfu": s.mfu_vs_bf16_peak,
        "mfu_own": s.mfu_vs_precision_peak,
        "n_fp8": s.num_float8_linears,
        "losses": result.numerics.loss_curve,
        "fp8_dtypes": result.environment.fp8_dtypes,
        "env": result.environment.model_dump(),
    }


def free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, debug shape, few steps: checks the script")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loss-steps", type=int, default=200)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--parts", default="throughput,loss")
    ap.add_argument("--budget-s", type=float, default=520.0, help="skip what would start after this many seconds")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    # Every recipe adds compiled variants of the same block code: raise dynamo's per-code-object limit
    # so that no run silently falls back to eager.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    device = torch.device("cpu" if args.smoke else "cuda")
    compile_blocks = (not args.smoke) if args.compile is None else args.compile
    if args.smoke:
        model, layers, seq, steps, warmup, loss_layers, loss_steps = "debug", 2, 64, 4, 1, 2, 10
    else:
        model, layers, seq, steps, warmup = "8b", 16, 8192, args.steps, args.warmup
        loss_layers, loss_steps = 4, args.loss_steps
    shape = get_shape(model, layers)
    recipes = args.recipes.split(",")
    devname = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    rows: dict[str, dict] = {r: {} for r in recipes}
    jl = (out / "gpu_runner.jsonl").open("a")

    def record(kind, recipe, data):
        data = {k: v for k, v in data.items() if k != "losses" or kind == "loss"}
        jl.write(json.dumps({"kind": kind, "recipe": recipe, "device": devname, **data}) + "\n")
        jl.flush()
        log.info("%s %s %s", kind, recipe, {k: v for k, v in data.items() if k not in ("env", "losses")})

    def time_left():
        return args.budget_s - (time.monotonic() - t_start)

    log.info(
        "device %s, torch %s, shape %s layers %d, seq %d, compile %s",
        devname,
        torch.__version__,
        model,
        layers,
        seq,
        compile_blocks,
    )
    if "throughput" in args.parts:
        for recipe in recipes:
            if time_left() < 60:
                log.warning("budget: skipping throughput of %s", recipe)
                continue
            spec = runner_spec(
                recipe,
                num_layers=layers,
                seq_len=seq,
                steps=steps,
                warmup=warmup,
                compile_blocks=compile_blocks,
                device_type=device.type,
                model=model,
                lr_warmup=warmup,
            )  # no loss spikes from a cold start at full LR
            try:
                rows[recipe]["ours"] = ours_run(spec)
                record("ours", recipe, rows[recipe]["ours"])
            except Exception as exc:  # noqa: BLE001 - one failure must not cost the rest of the lease
                log.exception("ours %s failed", recipe)
                rows[recipe]["ours_error"] = str(exc)[:300]
            free()
            try:
                rows[recipe]["ref"] = reference_run(shape, recipe, seq, steps, warmup, device, compile_blocks)
                record("ref", recipe, rows[recipe]["ref"])
            except Exception as exc:  # noqa: BLE001
                log.exception("ref %s failed", recipe)
                rows[recipe]["ref_error"] = str(exc)[:300]
            free()
    if "loss" in args.parts:
        for recipe in recipes:
            if time_left() < 45:
                log.warning("budget: skipping loss check of %s", recipe)
                continue
            spec = runner_spec(
                recipe,
                num_layers=loss_layers,
                seq_len=seq,
                steps=loss_steps,
                warmup=warmup,
                compile_blocks=compile_blocks,
                device_type=device.type,
                lr_warmup=loss_steps // 10,
                model=model,
            )
            try:
                res = ours_run(spec)
                tail = res["losses"][-50:]
                rows[recipe]["loss_mean_last50"] = sum(tail) / len(tail)
                rows[recipe]["loss_first"] = res["losses"][0]
                record("loss", recipe, {"losses": res["losses"], "mean_last50": rows[recipe]["loss_mean_last50"]})
            except Exception:  # noqa: BLE001
                log.exception("loss %s failed", recipe)
            free()
    jl.close()
    print_table(rows, devname, shape, seq, time.monotonic() - t_start)
    return 0


def fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)


def print_table(rows, devname, shape, seq, elapsed_s):
    bf16_peak, _ = peak_tflops(devname, "bf16")
    fpt = shape.flops_per_token(seq)
    base = rows.get("bf16", {})
    bf16_tps = base.get("ours", {}).get("tokens_per_sec")
    bf16_mem = base.get("ours", {}).get("peak_gib")
    bf16_loss = base.get("loss_mean_last50")
    lines = [
        f"\n== gpu_runner: {devname}, {shape.name} x{shape.num_layers} layers, {seq} tok/step, "
        f"{fpt / 1e9:.1f} GFLOP/token, {elapsed_s:.0f} s ==",
        f"{'recipe':<18} {'ours tok/s':>10} {'ref tok/s':>10} {'ours/ref':>8} {'MFU ours':>8} {'MFU ref':>8} "
        f"{'MFU own':>8} {'vs bf16':>8} {'mem ours':>9} {'mem ref':>8} {'loss50':>8} {'gap':>7}",
    ]
    for recipe, r in rows.items():
        o, f = r.get("ours", {}), r.get("ref", {})
        ratio = o["tokens_per_sec"] / f["tokens_per_sec"] if o and f else None
        mfu_ref = fpt * f["tokens_per_sec"] / 1e12 / bf16_peak if f and bf16_peak else None
        speed = o["tokens_per_sec"] / bf16_tps if o and bf16_tps else None
        loss = r.get("loss_mean_last50")
        gap = (loss - bf16_loss) / bf16_loss if loss is not None and bf16_loss else None
        lines.append(
            f"{recipe:<18} {fmt(o.get('tokens_per_sec')):>10} {fmt(f.get('tokens_per_sec')):>10} "
            f"{fmt(ratio, '{:.3f}'):>8} {fmt(o.get('mfu'), '{:.1%}'):>8} {fmt(mfu_ref, '{:.1%}'):>8} "
            f"{fmt(o.get('mfu_own'), '{:.1%}'):>8} {fmt(speed, '{:.3f}'):>8} "
            f"{fmt(o.get('peak_gib'), '{:.1f}'):>9} {fmt(f.get('peak_gib'), '{:.1f}'):>8} "
            f"{fmt(loss, '{:.4f}'):>8} {fmt(gap, '{:+.2%}'):>7}"
        )
        for k in ("ours_error", "ref_error"):
            if k in r:
                lines.append(f"   {k}: {r[k]}")
    if bf16_mem is not None:
        lines.append(
            f"targets: ours/ref >= 1.0; bf16 MFU >= 54%; fp8-tensorwise >= 1.16x bf16; "
            f"fp8 mem <= bf16 ({bf16_mem:.1f} GiB); |loss gap| <= 2%"
        )
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
