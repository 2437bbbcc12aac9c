"""Does fp8 loss track bf16 on real text? bf16 and the three float8 recipes x seeds, through our runner, one GPU.

    python -m runner.corpus build --out data/                          # on a CPU machine; ship data/ (~3 MB)
    PYTHONUNBUFFERED=1 python bench/numerics_gpu.py --out $OUT --data data/pydocs-32k.bin \\
        --dim-shape 1b --layers 4 --steps 1000 --seeds 0,1,2 --tokens 4096 --budget-s 540
    python bench/numerics_gpu.py --smoke --out /tmp/numerics          # CPU: debug shape, checks the script

Every run is `python -m runner --spec spec.json --out result.json` (compile on, LR warm-up then cosine decay to
10% (lr_schedule cosine), held-out eval loss every --eval-every steps on the corpus' .val split).
Per recipe: the loss verdict of core.analysis.numerics (window gap, noise band from step noise and seed spread, slopes,
tracks / differs / inconclusive), the median tokens/s and step time over seeds. Writes numerics.json (every
run's curves and the verdicts) and numerics.png (train and eval loss of each recipe over bf16, window marked;
when matplotlib is installed) into --out, prints the table and its own elapsed time.

Budget: after the first run the script prints its estimate of the whole measurement (first run's wall time x
runs / --parallel); with --budget-s it stops there when the estimate is over the budget, so a configuration that
does not fit costs one run. --probe-steps N: time N steps of bf16 seed 0 only and print the estimate for --steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.analysis.numerics import LossVerdict, RunLosses, loss_verdict  # noqa: E402
from core.contracts.specs import RunResult, RunSpec, resolve_layout  # noqa: E402

RECIPES = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp")  # MX recipes need MX tensor cores
REPO = Path(__file__).resolve().parents[1]


def data_vocab(data: str | None) -> int | None:
    """The corpus tokenizer's vocabulary (its recipe beside the .bin), padded to a multiple of 128 (GEMM tiles)."""
    if not data:
        return None
    recipe = json.loads(Path(data).with_suffix(".json").read_text())
    return -(-int(recipe["tokenizer"]["vocab_size"]) // 128) * 128


def make_spec(args: argparse.Namespace, precision: str, seed: int, steps: int) -> RunSpec:
    return RunSpec(
        model=args.dim_shape,
        num_layers=args.layers,
        vocab_size=args.vocab_size,
        precision=precision,
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=args.tokens,
        local_batch_size=args.batch,
        steps=steps,
        warmup_steps=min(10, steps // 4),
        compile=not args.no_compile,
        lr=args.lr,
        lr_warmup_steps=min(args.lr_warmup, steps // 2),
        lr_schedule="cosine",
        seed=seed,
        data_path=str(Path(args.data).resolve()),
        data_roots=[str(Path(args.data).resolve().parent)],  # the corpus directory: the runner reads only there
        eval_every_steps=min(args.eval_every, steps),
        eval_batches=args.eval_batches,
        device_type="cpu" if args.smoke else "cuda",
        timeout_s=3600,
    )


def run_one(args: argparse.Namespace, spec: RunSpec, name: str) -> tuple[RunResult | None, float]:
    """(the result, wall seconds) of one `python -m runner` process."""
    run_dir = Path(args.out) / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json(indent=1))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "TORCHINDUCTOR_CACHE_DIR": str(Path(args.out) / "inductor-cache"),
    }  # later seeds reuse the compiles
    t0 = time.monotonic()
    with open(run_dir / "log.txt", "w") as log_file:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "runner",
                "--spec",
                str(run_dir / "spec.json"),
                "--out",
                str(run_dir / "result.json"),
            ],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - t0
    out = run_dir / "result.json"
    return (RunResult.model_validate_json(out.read_text()) if out.exists() else None), wall


def run_losses(name: str, seed: int, r: RunResult) -> RunLosses:
    curve = r.numerics.loss_curve if r.numerics else []
    ev = r.numerics.eval_curve if r.numerics else []
    return RunLosses(
        run_id=name,
        seed=seed,
        steps=tuple(range(len(curve))),
        losses=tuple(curve),
        eval_steps=tuple(p.step for p in ev),
        eval_losses=tuple(p.loss for p in ev),
    )


def plot(path: Path, results: dict, verdicts: dict[str, LossVerdict]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fp8 = [p for p in results if p != "bf16"]
    fig, axes = plt.subplots(1, max(1, len(fp8)), figsize=(5.5 * max(1, len(fp8)), 4), squeeze=False)
    for ax, precision in zip(axes[0], fp8):
        for prec, color in (("bf16", "tab:blue"), (precision, "tab:red")):
            for seed, (r, _) in sorted(results.get(prec, {}).items()):
                if r is None or r.numerics is None:
                    continue
                ax.plot(r.numerics.loss_curve, color=color, alpha=0.25, lw=0.8)
                ev = r.numerics.eval_curve
                ax.plot(
                    [p.step for p in ev],
                    [p.loss for p in ev],
                    color=color,
                    marker="o",
                    ms=3,
                    lw=1.2,
                    label=f"{prec} eval" if seed == min(results[prec]) else None,
                )
        v = verdicts.get(precision)
        if v is not None and v.window_first_step is not None:
            ax.axvspan(v.window_first_step, v.window_last_step, color="grey", alpha=0.15, label="window")
        ax.set_title(f"{precision}: {v.verdict if v else '-'}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (train: thin, held-out: dots)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (numerics.json, numerics.png, runs/)")
    ap.add_argument("--data", help="token file built by `python -m runner.corpus build` (.val beside it)")
    ap.add_argument("--dim-shape", default="1b", choices=("debug", "1b", "8b"), help="Llama-3 dims (default 1b)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--tokens", type=int, default=8192, help="sequence length (tokens a step: this x --batch)")
    ap.add_argument("--batch", type=int, default=1, help="sequences a step")
    ap.add_argument(
        "--vocab-size",
        type=int,
        help="model vocabulary (default: the corpus tokenizer's, padded to 128; without --data: the shape's)",
    )
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--lr-warmup", type=int, default=100, help="linear LR warm-up steps, then cosine to 10%%")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs sharing the GPU at once (overlaps start-up and compile; tok/s then shared)",
    )
    ap.add_argument("--budget-s", type=float, help="stop after the first run when the estimate exceeds this")
    ap.add_argument("--probe-steps", type=int, help="time bf16 seed 0 for this many steps, estimate, stop")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU: debug shape, 2 layers, 48 steps, 64 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.dim_shape, args.layers, args.steps, args.tokens, args.no_compile = "debug", 2, 48, 64, True
        args.lr, args.lr_warmup, args.eval_every, args.eval_batches = 3e-3, 8, 12, 2
    if args.data and not Path(args.data).is_file():
        ap.error(f"--data {args.data!r} does not exist: build it with `python -m runner.corpus build --out DIR`")
    args.vocab_size = args.vocab_size or data_vocab(args.data)
    t_start = time.monotonic()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    recipes = [r.strip() for r in args.recipes.split(",")]
    jobs = [(p, s) for s in seeds for p in recipes]  # a seed's recipes together: an early look at every recipe

    if args.probe_steps:
        r, wall = run_one(args, make_spec(args, "bf16", seeds[0], args.probe_steps), "probe")
        if r is None or r.summary is None:
            print(f"probe failed after {wall:.0f} s (see {args.out}/runs/probe/log.txt)")
            return 1
        step_s = r.summary.step_ms_median / 1000
        start_s = wall - step_s * args.probe_steps
        est = len(jobs) * (start_s + step_s * args.steps) / args.parallel
        print(
            f"probe: {step_s * 1000:.1f} ms/step bf16, {r.summary.tokens_per_sec:,.0f} tok/s, start-up+compile "
            f"~{start_s:.0f} s; {len(jobs)} runs x {args.steps} steps: ~{est:.0f} s at --parallel {args.parallel} "
            f"(fp8 steps are 0.8-1.3x bf16's)"
        )
        return 0

    results: dict[str, dict[int, tuple[RunResult | None, float]]] = {}
    first, rest = jobs[0], jobs[1:]
    r, wall = run_one(args, make_spec(args, *first, args.steps), f"{first[0]}-s{first[1]}")
    results.setdefault(first[0], {})[first[1]] = (r, wall)
    if r is None or r.status != "succeeded":
        log_tail = (Path(args.out) / "runs" / f"{first[0]}-s{first[1]}" / "log.txt").read_text()[-3000:]
        print(f"first run failed after {wall:.0f} s: {r.error.message[:500] if r and r.error else ''}\n{log_tail}")
        return 1
    estimate = wall * len(jobs) / args.parallel
    print(
        f"first run {first[0]} seed {first[1]}: {wall:.0f} s; estimate for {len(jobs)} runs at --parallel "
        f"{args.parallel}: ~{estimate:.0f} s",
        flush=True,
    )
    if args.budget_s and estimate > args.budget_s:
        print(f"over the budget ({args.budget_s:.0f} s): stopping; choose fewer --steps, --layers or --tokens")
        return 2
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {pool.submit(run_one, args, make_spec(args, p, s, args.steps), f"{p}-s{s}"): (p, s) for p, s in rest}
        for fut, (p, s) in futures.items():
            results.setdefault(p, {})[s] = fut.result()
            print(f"  {p} seed {s}: {results[p][s][1]:.0f} s", flush=True)

    losses = {
        p: [
            run_losses(f"{p}-s{s}", s, r)
            for s, (r, _) in sorted(by_seed.items())
            if r is not None and r.status == "succeeded"
        ]
        for p, by_seed in results.items()
    }
    verdicts = {p: loss_verdict(losses[p], losses.get("bf16", [])) for p in recipes if p != "bf16"}
    rows = []
    header = f"{'recipe':20} {'tok/s':>9} {'step ms':>8} {'ok':>4} {'gap':>8} {'band':>8}  verdict"
    print(header)
    for p in recipes:
        ok = [r for r, _ in results.get(p, {}).values() if r is not None and r.status == "succeeded"]
        tps = statistics.median(r.summary.tokens_per_sec for r in ok) if ok else None
        ms = statistics.median(r.summary.step_ms_median for r in ok) if ok else None
        v = verdicts.get(p)
        row = dict(
            recipe=p,
            tokens_per_sec=tps,
            step_ms=ms,
            runs_ok=len(ok),
            runs=len(results.get(p, {})),
            verdict=v.model_dump() if v else None,
            errors=[r.error.message[:300] for r, _ in results.get(p, {}).values() if r and r.error],
        )
        rows.append(row)
        gap = f"{v.gap:+.2%}" if v and v.gap is not None else "-"
        band = f"±{v.band:.2%}" if v and v.band is not None else "-"
        text = f"{v.verdict}: {v.reason}" if v else "(reference)"
        print(
            f"{p:20} {tps or 0:>9,.0f} {ms or 0:>8.1f} {len(ok):>2}/{len(results.get(p, {}))} {gap:>8} "
            f"{band:>8}  {text}"
        )
    elapsed = time.monotonic() - t_start
    config = {k: v for k, v in vars(args).items() if k not in ("out",)}
    curves = {
        p: {
            str(s): {
                "loss": r.numerics.loss_curve,
                "eval": [e.model_dump() for e in r.numerics.eval_curve],
                "data": r.numerics.data,
            }
            for s, (r, _) in by_seed.items()
            if r is not None and r.numerics is not None
        }
        for p, by_seed in results.items()
    }
    Path(args.out, "numerics.json").write_text(
        json.dumps({"config": config, "elapsed_s": elapsed, "table": rows, "curves": curves}, indent=1)
    )
    drew = plot(Path(args.out) / "numerics.png", results, verdicts)
    print(
        f"wrote {args.out}/numerics.json{' and numerics.png' if drew else ' (no matplotlib: no PNG)'}; "
        f"elapsed {elapsed:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
