"""Our runner against TorchTitan 0.2.2 on one GPU: the same shape and recipes, run alternately, one table.

    bash scripts/peer-wheels.sh                                     # where there is network: wheels into .whl
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    python3 bench/peer_torchtitan.py --out OUT                      # one GPU: the full table (+ loss check)
    python bench/peer_torchtitan.py --smoke --out OUT               # CPU: tiny shapes, checks the whole script

Shape: Llama-3-8B dimensions with 16 layers, 1 x 8192 tokens a step, per-block torch.compile and the compiled
loss, fused AdamW, grad-norm clipping at 1.0, no activation checkpointing, fp32 master weights under bf16
autocast (what both do on one GPU). Recipes: bf16 and torchao's float8 tensorwise, rowwise and
rowwise_with_gw_hp, the output layer left in bf16 on both sides.

- TorchTitan: its own Trainer on the job config of engine torchtitan (runner.titan_config's TOML of the same
  RunSpec, TorchTitan's llama3 with our shape and runner.data's batches registered by runner.titan_spec), run and
  measured by runner.titan.run, in-process: both sides train on the same tokens. Nothing is downloaded and no
  TorchTitan file is edited.
- ours: runner.train.run(RunSpec) in-process, world size 1.

Each (system, recipe) runs in its own process (fresh CUDA context, compile caches and inductor settings:
TorchTitan sets inductor's emulate_precision_casts for rowwise), in the order TorchTitan, ours, ours,
TorchTitan, ... so that neither side always runs first. Both are timed the same way: a CUDA event after every
optimizer step (a global optimizer-step hook, so neither train loop is changed); tokens/s from the median step
time after warm-up. TorchTitan's own tps/MFU log lines are kept as a cross-check. Peak memory: the largest
allocation over the training steps (torch.cuda.max_memory_allocated). Optionally the step is profiled (GPU
kernel time per category, bench/profile_fp8.py's categories) for both sides, and our runner's fp8-vs-bf16 loss
check runs in the same process as its throughput run (4 layers, 200 steps, the last 50 compared).
The table is printed last; every measurement goes to OUT/peer_results.json and every log to OUT/peer_logs.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RECIPES = ("bf16", "tensorwise", "rowwise", "rowwise_with_gw_hp")
OURS_PRECISION = {
    "bf16": "bf16",
    "tensorwise": "fp8-tensorwise",
    "rowwise": "fp8-rowwise",
    "rowwise_with_gw_hp": "fp8-rowwise-gw-hp",
}
GIB = 1024**3


# ============================================================================================ worker side


def step_clock(device_type: str, also=None):
    """The product's optimizer-step clock (runner.titan), which both sides are timed with."""
    from runner.titan import OptimizerStepClock

    return OptimizerStepClock(device_type, also=also)


def apply_settings(settings: list[str]) -> None:
    """--set NAME=VALUE: inductor.X / dynamo.X (torch._inductor.config / torch._dynamo.config) or module.attr."""
    import importlib

    import torch

    for item in settings:
        name, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        owner_name, _, attr = name.rpartition(".")
        owner = {"inductor": torch._inductor.config, "dynamo": torch._dynamo.config}.get(owner_name)
        if owner is None:
            owner = importlib.import_module(owner_name)
        if not hasattr(owner, attr):
            raise ValueError(f"--set {item}: {owner_name} has no attribute {attr!r}")
        setattr(owner, attr, value)


def profiler_for(args, device_type: str):
    """A torch.profiler over the last 1 + args.profile_steps steps, or None."""
    if not args.profile_steps:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule

    total = args.warmup + args.steps + 1 + args.profile_steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    return profile(
        activities=activities,
        schedule=schedule(wait=total - args.profile_steps - 1, warmup=1, active=args.profile_steps),
    )


def kernel_summary(prof, device_type: str, active_steps: int) -> dict:
    """ms per step by category (bench/profile_fp8.py's) and the top 40 kernels."""
    import torch

    from bench.profile_fp8 import category, is_annotation

    averages = prof.key_averages()
    # steps actually recorded (the profiler's own step annotations), rather than the schedule's count
    active_steps = (
        sum(
            e.count
            for e in averages
            if e.key.startswith("ProfilerStep") and e.device_type == torch.autograd.DeviceType.CPU
        )
        or active_steps
    )
    totals: dict[str, float] = {}
    kernels = []
    for evt in averages:
        if device_type == "cuda":
            us = evt.self_device_time_total
            if us <= 0 or evt.device_type != torch.autograd.DeviceType.CUDA or is_annotation(evt.key):
                continue
        else:
            us = evt.self_cpu_time_total
        cat = category(evt.key)
        totals[cat] = totals.get(cat, 0.0) + us / 1000 / active_steps
        kernels.append(
            {"name": evt.key[:200], "calls": evt.count, "ms_per_step": us / 1000 / active_steps, "category": cat}
        )
    kernels.sort(key=lambda k: -k["ms_per_step"])
    return {"ms_per_step": totals, "top_kernels": kernels[:60], "steps": active_steps}


def timed_stats(step_ms: list[float], warmup: int, steps: int) -> dict:
    # step_ms[i] is step i+1 (1-based: the clock is marked before the first step); timed: warmup+1 .. warmup+steps.
    timed = step_ms[warmup : warmup + steps]
    return {
        "step_ms_median": statistics.median(timed),
        "step_ms_min": min(timed),
        "step_ms_max": max(timed),
        "num_timed": len(timed),
    }


def memory_stats(device_type: str) -> dict:
    import torch

    if device_type != "cuda":
        return {}
    return {
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
    }


def bench_spec(
    args, device_type: str, *, num_layers: int, steps: int, warmup: int, lr_warmup: int, engine: str = "scalebench"
):
    """The RunSpec both systems run: one device, the bench shape and recipe."""
    from core.contracts.specs import RunSpec, resolve_layout

    return RunSpec(
        engine=engine,
        model=args.model,
        num_layers=num_layers,
        precision=OURS_PRECISION[args.recipe],
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=args.seq_len,
        local_batch_size=1,
        steps=steps,
        warmup_steps=warmup,
        compile=args.compile,
        lr=3e-4,
        lr_warmup_steps=lr_warmup,
        device_type=device_type,
    )


def run_ours(args, device_type: str) -> dict:
    import torch

    from runner.train import run

    def spec(num_layers: int, steps: int, warmup: int, lr_warmup: int):
        return bench_spec(args, device_type, num_layers=num_layers, steps=steps, warmup=warmup, lr_warmup=lr_warmup)

    prof = profiler_for(args, device_type)
    total = args.warmup + args.steps + (1 + args.profile_steps if prof else 0)
    out: dict = {}
    if prof:
        prof.start()
    clock = step_clock(device_type, also=prof.step if prof else None)
    clock.mark()
    result = run(spec(args.layers, total, args.warmup, args.warmup))
    clock.close()
    step_ms = clock.step_ms()
    if prof:
        prof.stop()
        out["profile"] = kernel_summary(prof, device_type, args.profile_steps)
    if result.status != "succeeded":
        raise RuntimeError(f"runner failed: {result.error.kind}: {result.error.message[:3000]}")
    s = result.summary
    out.update(
        step_ms=step_ms,
        **timed_stats(step_ms, args.warmup, args.steps),
        **memory_stats(device_type),
        own={
            "tokens_per_sec": s.tokens_per_sec,
            "step_ms_median": s.step_ms_median,
            "peak_alloc_gib": s.peak_memory_allocated_gib,
        },
        num_float8_linears=s.num_float8_linears,
        losses=result.numerics.loss_curve,
        env=result.environment.model_dump(),
    )
    if args.loss_steps:
        import gc

        gc.collect()
        if device_type == "cuda":
            torch.cuda.empty_cache()
        t0 = time.monotonic()
        check = run(spec(args.loss_layers, args.loss_steps, 2, args.loss_steps // 10))
        if check.status != "succeeded":
            raise RuntimeError(f"loss check failed: {check.error.kind}: {check.error.message[:3000]}")
        out["loss_check"] = {
            "losses": check.numerics.loss_curve,
            "layers": args.loss_layers,
            "steps": args.loss_steps,
            "wall_s": time.monotonic() - t0,
        }
    return out


class TitanLogCapture:
    """Keeps TorchTitan's metric lines (step, loss, memory, tps, tflops, mfu) from its root logger."""

    def __init__(self):
        import logging
        import re

        self.pattern = re.compile(
            r"step:\s*(\d+).*?loss:\s*([-\d.]+).*?tps:\s*([\d,]+).*?tflops:\s*([\d,.]+)"
            r".*?mfu:\s*([\d.]+)%"
        )
        self.rows: list[dict] = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                m = outer.pattern.search(record.getMessage())
                if m:
                    outer.rows.append(
                        {
                            "step": int(m[1]),
                            "loss": float(m[2]),
                            "tps": float(m[3].replace(",", "")),
                            "tflops": float(m[4].replace(",", "")),
                            "mfu_pct": float(m[5]),
                        }
                    )

        logging.getLogger().addHandler(Handler())


def titan_dry_run(spec) -> dict:
    """CPU check of the TorchTitan side without training (TorchTitan's Trainer needs an accelerator): the job
    config of the RunSpec parsed by TorchTitan, the registered flavor, the first batch of its dataloader, the model
    built on meta and the float8 converter applied (emulated, as TorchTitan allows without compile), as the
    Trainer would do them."""
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.protocols.train_spec import get_train_spec

    import runner.titan_spec  # noqa: F401 - registers the train spec, as the Trainer's custom_import does
    from runner import titan_config

    gpu_spec = spec.model_copy(update={"device_type": "cuda"})  # engine torchtitan refuses CPU specs
    path = Path(tempfile.mkdtemp(prefix="titan-dry-")) / "titan.toml"
    path.write_text(titan_config.job_toml(gpu_spec, dump_folder=str(path.parent)))
    config = ConfigManager().parse_args(titan_config.cli_args(str(path)))
    config.quantize.linear.float8.emulate = True  # no float8 GEMM on CPU
    config.compile.enable = False
    train_spec = get_train_spec(config.model.name)
    loader = train_spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=None, job_config=config)
    inputs, labels = next(iter(loader))
    model_args = train_spec.model_args[config.model.flavor]
    model_args.update_from_config(config)
    with torch.device("meta"):
        model = train_spec.model_cls(model_args)
    p = config.parallelism
    dims = ParallelDims(
        dp_shard=p.data_parallel_shard_degree,
        dp_replicate=p.data_parallel_replicate_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=1,
    )
    build_model_converters(config, dims).convert(model)
    return {
        "dry_run": True,
        "batch_shape": list(inputs["input"].shape),
        "max_token": int(inputs["input"].max()),
        "vocab_size": model_args.vocab_size,
        "num_float8_linears": sum(type(m).__name__ == "Float8Linear" for m in model.modules()),
        "num_linears": sum(isinstance(m, torch.nn.Linear) for m in model.modules()),
    }


def run_titan(args, device_type: str) -> dict:
    """TorchTitan's Trainer through engine torchtitan (runner.titan.run), timed by its optimizer-step clock."""
    import logging

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from runner.titan import run

    total = args.warmup + args.steps + (1 + args.profile_steps if args.profile_steps else 0)
    spec = bench_spec(
        args,
        device_type,
        num_layers=args.layers,
        steps=total,
        warmup=args.warmup,
        lr_warmup=args.warmup,
        engine="torchtitan",
    )
    if device_type == "cpu":
        return titan_dry_run(spec)
    logging.getLogger().setLevel(logging.INFO)
    capture = TitanLogCapture()
    prof = profiler_for(args, device_type)
    out: dict = {}
    hook = None
    if prof:
        prof.start()
        hook = register_optimizer_step_post_hook(
            lambda opt, *_: prof.step() if isinstance(opt, torch.optim.AdamW) else None
        )
    run_dir = Path(args.work) / f"titan-out-{args.recipe}"
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(spec, run_dir)
    finally:
        if prof:
            hook.remove()
            prof.stop()
    if prof:
        out["profile"] = kernel_summary(prof, device_type, args.profile_steps)
    if result.status != "succeeded":
        raise RuntimeError(f"torchtitan failed: {result.error.kind}: {result.error.message[:3000]}")
    s = result.summary
    step_ms = [r.step_ms for r in result.steps]
    out.update(
        step_ms=step_ms,
        **timed_stats(step_ms, args.warmup, args.steps),
        peak_alloc_gib=s.peak_memory_allocated_gib,
        peak_reserved_gib=s.peak_memory_reserved_gib,
        own={"log_rows": capture.rows},
        num_float8_linears=s.num_float8_linears,
        losses=result.numerics.loss_curve,
        env=result.environment.model_dump(),
    )
    return out


def versions() -> dict:
    import importlib.metadata as md

    import torch

    v = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for pkg in ("torchao", "torchtitan", "datasets", "triton"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    if torch.cuda.is_available():
        v["device"] = torch.cuda.get_device_name()
    return v


def worker_main(args) -> int:
    import logging

    import torch

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    device_type = "cpu" if args.model == "debug" else "cuda"
    apply_settings(args.set)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    t0 = time.monotonic()
    record = {
        "system": args.system,
        "recipe": args.recipe,
        "variant": args.variant,
        "settings": args.set,
        "layers": args.layers,
        "seq_len": args.seq_len,
        "versions": versions(),
    }
    try:
        record.update(run_titan(args, device_type) if args.system == "titan" else run_ours(args, device_type))
        record["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the failure is the result; the orchestrator carries on
        import traceback

        traceback.print_exc()
        record.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:3000]}")
    record["wall_s"] = time.monotonic() - t0
    Path(args.result).write_text(json.dumps(record))
    if device_type == "cuda" and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# ======================================================================================== orchestrator side


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(
    recipes: list[str], variants: list[tuple[str, str, list[str]]], systems: tuple[str, ...] = ("titan", "ours")
) -> list[tuple[str, str, str, list[str]]]:
    """(system, recipe, variant, settings): per recipe TorchTitan and ours (those of `systems`), the order flipped
    every recipe; then the extra variants of ours (--ours-variant NAME:RECIPE:SETTING,...), in the order given."""
    jobs = []
    for i, recipe in enumerate(r for r in recipes if r):
        pair = [(s, recipe, "", []) for s in ("titan", "ours") if s in systems]
        jobs += pair if i % 2 == 0 else pair[::-1]
    return jobs + [("ours", r, name, settings) for name, r, settings in variants]


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    name, recipe, settings = (text.split(":", 2) + [""])[:3]
    if recipe not in RECIPES:
        raise SystemExit(f"--ours-variant {text}: recipe must be one of {', '.join(RECIPES)}")
    return name, recipe, [s for s in settings.split(",") if s]


def run_job(args, job, log, deadline: float) -> dict:
    system, recipe, variant, settings = job
    label = f"{system}{'+' + variant if variant else ''} {recipe}"
    timeout = min(args.job_timeout_s, deadline - time.monotonic())
    if timeout < args.min_job_s:
        return {"system": system, "recipe": recipe, "variant": variant, "ok": False, "error": "skipped: budget"}
    result = Path(args.work) / f"result-{system}-{variant or 'base'}-{recipe}.json"
    result.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--system",
        system,
        "--recipe",
        recipe,
        "--variant",
        variant,
        "--result",
        str(result),
        "--work",
        args.work,
        "--model",
        args.model,
        "--layers",
        str(args.layers),
        "--seq-len",
        str(args.seq_len),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--loss-steps",
        str(args.loss_steps if system == "ours" and (args.variant_loss or not variant) else 0),
        "--loss-layers",
        str(args.loss_layers),
        "--compile" if args.compile else "--no-compile",
    ]
    profiled = recipe in args.profile.split(",") and not variant
    cmd += ["--profile-steps", str(args.profile_steps if profiled else 0)]
    for s in settings:
        cmd += ["--set", s]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(Path(args.work) / "hf"),
    }
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(args.work) / "inductor"))
    if args.model == "debug":
        env.setdefault("OMP_NUM_THREADS", "1")  # CPU smoke: no OpenMP spinning on a shared machine
    if profiled and args.dump_code:  # inductor's generated code, to read the profiled kernels by name
        env.update(TORCH_LOGS="output_code", TORCH_LOGS_OUT=str(Path(args.work) / "code" / f"{system}-{recipe}.log"))
        (Path(args.work) / "code").mkdir(exist_ok=True)
    log.write(f"\n===== {label}: {' '.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    try:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "system": system,
            "recipe": recipe,
            "variant": variant,
            "ok": False,
            "error": f"timeout after {timeout:.0f} s",
        }
    rec = (
        json.loads(result.read_text())
        if result.exists()
        else {"system": system, "recipe": recipe, "variant": variant, "ok": False, "error": "no result (see log)"}
    )
    status = rec.get("error", "")[:200]
    if rec.get("ok"):
        status = "dry run ok" if rec.get("dry_run") else f"{rec['step_ms_median']:.1f} ms/step"
    print(f"[{time.monotonic() - t0:5.0f} s] {label}: {status}", flush=True)
    return rec


def tokens_per_sec(rec: dict, seq_len: int) -> float | None:
    return seq_len / (rec["step_ms_median"] / 1000) if rec.get("ok") and rec.get("step_ms_median") else None


def loss_gap_rows(records: list[dict]) -> dict[tuple[str, str], float]:
    """Mean loss over the last 50 steps of each (recipe, variant)'s loss check (ours)."""
    means = {}
    for r in records:
        lc = r.get("loss_check")
        if r.get("ok") and lc:
            tail = lc["losses"][-50:]
            means[(r["recipe"], r.get("variant", ""))] = sum(tail) / len(tail)
    return means


def table(records: list[dict], args, elapsed_s: float) -> str:
    from core.catalog.hardware import peak_tflops
    from core.catalog.shapes import get_shape

    shape = get_shape(args.model, args.layers)
    fpt = shape.flops_per_token(args.seq_len)
    env = next((r["versions"] for r in records if r.get("versions")), {})
    device = env.get("device", "cpu")
    bf16_peak, _ = peak_tflops(device, "bf16")

    def get(system, recipe, variant=""):
        return next(
            (r for r in records if (r["system"], r["recipe"], r.get("variant", "")) == (system, recipe, variant)), {}
        )

    def mfu(tps):
        return fpt * tps / 1e12 / bf16_peak if tps and bf16_peak else None

    def f(x, spec):
        return "-" if x is None else spec.format(x)

    base = {s: tokens_per_sec(get(s, "bf16"), args.seq_len) for s in ("titan", "ours")}
    losses = loss_gap_rows(records)
    lines = [
        f"\n== peer_torchtitan: {device}, torch {env.get('torch')}, torchao {env.get('torchao')}, "
        f"torchtitan {env.get('torchtitan')}; {shape.name} x{args.layers} layers, {args.seq_len} tok/step, "
        f"{fpt / 1e9:.1f} GFLOP/token; {args.warmup} warm-up + {args.steps} timed steps; {elapsed_s:.0f} s ==",
        f"{'recipe':<22} {'titan tok/s':>11} {'ours tok/s':>10} {'ours/titan':>10} {'MFU titan':>9} "
        f"{'MFU ours':>8} {'x bf16 T':>8} {'x bf16 O':>8} {'GiB titan':>9} {'GiB ours':>8} "
        f"{'fp8 lin T/O':>11} {'loss50 O':>8} {'gap O':>7}",
    ]
    # a row per recipe (and variant) of either system: --systems titan (or ours) alone still gets its rows
    keys = [(r["recipe"], r.get("variant", "") if r["system"] == "ours" else "") for r in records]
    keys = list(dict.fromkeys(keys))
    for recipe, variant in keys:
        t, o = get("titan", recipe) if not variant else {}, get("ours", recipe, variant)
        tt, to = tokens_per_sec(t, args.seq_len), tokens_per_sec(o, args.seq_len)
        loss, ref = losses.get((recipe, variant)), losses.get(("bf16", ""))
        gap = (loss - ref) / ref if loss is not None and ref else None
        name = recipe + (f" [{variant}]" if variant else "")
        lines.append(
            f"{name:<22} {f(tt, '{:,.0f}'):>11} {f(to, '{:,.0f}'):>10} "
            f"{f(to / tt if tt and to else None, '{:.3f}'):>10} {f(mfu(tt), '{:.1%}'):>9} {f(mfu(to), '{:.1%}'):>8} "
            f"{f(tt / base['titan'] if tt and base['titan'] else None, '{:.3f}'):>8} "
            f"{f(to / base['ours'] if to and base['ours'] else None, '{:.3f}'):>8} "
            f"{f(t.get('peak_alloc_gib'), '{:.1f}'):>9} {f(o.get('peak_alloc_gib'), '{:.1f}'):>8} "
            f"{str(t.get('num_float8_linears', '-')) + '/' + str(o.get('num_float8_linears', '-')):>11} "
            f"{f(loss, '{:.4f}'):>8} {f(gap, '{:+.2%}'):>7}"
        )
        ob = tokens_per_sec(get("ours", recipe), args.seq_len) if variant else None
        if ob and to:
            lines[-1] += f"   (x ours {recipe}: {to / ob:.3f})"
        for r, who in ((t, "titan"), (o, "ours")):
            if r and not r.get("ok"):
                lines.append(f"    {who} {name}: {r.get('error', '')[:300]}")
    lines.append(
        "tok/s from the median step time (CUDA events after each optimizer step, same hook on both sides); "
        "MFU against the dense bf16 peak; GiB = peak allocated over the training steps; "
        "fp8 lin = Float8Linear modules; loss50 = our runner's mean loss over the last 50 of "
        f"{args.loss_steps} steps ({args.loss_layers} layers), gap vs bf16."
    )
    return "\n".join(lines)


def profile_table(records: list[dict]) -> str:
    rows = [r for r in records if r.get("profile")]
    if not rows:
        return ""
    from bench.profile_fp8 import CATEGORIES

    names = [f"{r['system']}{'+' + r['variant'] if r.get('variant') else ''} {r['recipe']}"[:24] for r in rows]
    lines = [
        "\nGPU kernel ms per step by category (profiled steps)",
        f"{'category':<40}" + "".join(f"{n:>25}" for n in names),
    ]
    for cat in CATEGORIES:
        lines.append(f"{cat:<40}" + "".join(f"{r['profile']['ms_per_step'].get(cat, 0.0):>25.1f}" for r in rows))
    lines.append(f"{'sum':<40}" + "".join(f"{sum(r['profile']['ms_per_step'].values()):>25.1f}" for r in rows))
    return "\n".join(lines)


def orchestrate(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="scalebench-peer-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    jobs = plan(args.recipes.split(","), [parse_variant(v) for v in args.variant_spec], tuple(args.systems.split(",")))
    records = []
    with (out / "peer_logs.txt").open("a") as log:
        for job in jobs:
            records.append(run_job(args, job, log, deadline))
            (out / "peer_results.json").write_text(json.dumps(records, indent=1))
    text = table(records, args, time.monotonic() - t_start) + profile_table(records)
    (out / "peer_table.txt").write_text(text + "\n")
    code = Path(args.work) / "code"
    if code.is_dir() and any(code.iterdir()):
        subprocess.run(["tar", "-czf", str(out / "inductor_code.tar.gz"), "-C", str(code), "."], check=False)
    print(text, flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "peer-out"))
    ap.add_argument("--work", default=None, help="scratch directory (TorchTitan's runs); default: a temp dir")
    ap.add_argument("--smoke", action="store_true", help="CPU: debug shapes, a few steps, no compile")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    ap.add_argument("--loss-steps", type=int, default=200, help="our runner's loss check (0: none)")
    ap.add_argument("--loss-layers", type=int, default=4)
    ap.add_argument("--profile", default="", help="recipes to profile on both sides, e.g. rowwise,bf16")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--dump-code", action="store_true", help="keep inductor's code of the profiled runs")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--ours-variant",
        dest="variant_spec",
        action="append",
        default=[],
        help="an extra run of ours: NAME:RECIPE:SETTING[,SETTING] (settings as in --set)",
    )
    ap.add_argument("--systems", default="titan,ours", help="which systems run the base recipes")
    ap.add_argument("--variant-loss", action="store_true", help="the --ours-variant runs get the loss check too")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no job after this many seconds")
    ap.add_argument("--job-timeout-s", type=float, default=240.0)
    ap.add_argument("--min-job-s", type=float, default=45.0, help="skip a job with less time than this left")
    # worker-only arguments
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", choices=("titan", "ours"), help=argparse.SUPPRESS)
    ap.add_argument("--recipe", choices=RECIPES, help=argparse.SUPPRESS)
    ap.add_argument("--variant", dest="variant", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="8b", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE before the run (worker)")
    args = ap.parse_args()
    if args.smoke and not args.worker:  # CPU: TorchTitan is only configured and built (see titan_dry_run)
        args.model, args.layers, args.seq_len, args.steps, args.warmup = "debug", 1, 32, 3, 2
        args.loss_steps, args.loss_layers, args.compile = min(args.loss_steps, 55), 1, False
        args.profile = args.profile or "rowwise"
    return worker_main(args) if args.worker else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
