"""Does fp8 pay off in time to the same loss? One experiment through the whole service on one GPU node.

1. `python -m cli.main up` (the embedded stack: API, worker, scheduler; SQLite + filesystem broker) with a clusters
   file describing this node (one GPU, `torchtitan = true`);
2. `python -m cli.main submit SPEC`: ONE experiment, --precisions x --seeds with --engine, Llama-3-8B dims at
   --layers layers, --seq-len tokens a step, LR warm-up then cosine to 10%, held-out loss every --eval-every steps
   on the corpus' .val split (engine scalebench; TorchTitan runs without held-out evaluation), compile on;
3. polls the experiment until every run ended or --budget-s passed (then cancels it: what finished is kept), and
   writes into --out: time_to_loss.json (per run: engine, precision, seed, steps, tokens a step, the train loss of
   every step, the held-out (step, loss) pairs, tokens/s and step time, environment; the spec and the corpus
   recipe) and service_report.json (the served /scaling report), then prints one table.

The worker runs one run at a time (`scalebench up`: one worker process), so every run has the GPU alone and its
throughput is valid as measured. Run from the repository root on the GPU node (wheels: scripts/offline-wheels.sh;
corpus: runner/corpus.py's --code recipe, see bench/results/2026-12-04-time-to-loss-h200.md):

    PYTHONUNBUFFERED=1 python3 bench/time_to_loss_gpu.py --out OUT --data data/pycode-32k.bin --seeds 0 \\
        --layers 2 --steps 1000 --budget-s 500
    python bench/time_to_loss_gpu.py --smoke --out /tmp/ttl --data data/pycode-32k.bin    # CPU: debug shape
    python bench/time_to_loss_gpu.py --from-json bench/results/2026-12-04-time-to-loss-h200.json  # the tables again
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import start_stack, stop_stack  # noqa: E402
from core.analysis.numerics import RunLosses, loss_verdict, short_verdict  # noqa: E402
from core.analysis.time_to_loss import short_effective, time_to_loss  # noqa: E402

PRECISIONS = ("bf16", "fp8-rowwise", "fp8-tensorwise", "fp8-rowwise-gw-hp")  # bf16 first: the reference
TAIL_STEPS = 50  # "final" train loss: the mean over the last TAIL_STEPS steps


def clusters_toml(device_name: str, smoke: bool, data: Path) -> str:
    """This node as one cluster, the corpus' directory its data root (a spec's data_path must lie in one)."""
    vendor, titan = ("cpu", "false") if smoke else ("nvidia", "true")
    return (
        f'[[cluster]]\nname = "gpu-node"\nvendor = "{vendor}"\ndevice_name = "{device_name}"\n'
        f'gpus_per_node = 1\nmax_nodes = 1\nlauncher = "local"\ntorchtitan = {titan}\n'
        f"data_roots = [{json.dumps(str(data.resolve().parent))}]\n"
    )


def corpus_vocab(data: Path) -> int:
    """The corpus tokenizer's vocabulary (its recipe beside the .bin), padded to a multiple of 128."""
    recipe = json.loads(data.with_suffix(".json").read_text())
    return -(-int(recipe["tokenizer"]["vocab_size"]) // 128) * 128


def experiment_spec(args: argparse.Namespace) -> dict:
    titan = args.engine == "torchtitan"
    spec = {
        "name": f"time to loss: {args.engine} {','.join(args.precisions)} seeds {args.seeds}, 8b x{args.layers}, "
        f"{args.seq_len} tokens, {args.steps} steps",
        "model": "8b",
        "num_layers": args.layers,
        "cluster": "gpu-node",
        "gpu_counts": [1],
        "engines": [args.engine],
        "precisions": list(args.precisions),
        "layouts": ["fsdp"],
        "scaling": "weak",
        "seq_len": args.seq_len,
        "local_batch_size": 1,
        "vocab_size": corpus_vocab(args.data),
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "lr": args.lr,
        "lr_warmup_steps": args.lr_warmup,
        "lr_schedule": "cosine",
        "seeds": list(args.seeds),
        "repeats": args.repeats,
        "eval_every_steps": 0 if titan else args.eval_every,
        "eval_batches": args.eval_batches,
        "compile": True,
        "data_path": str(args.data.resolve()),
        "timeout_s": args.run_timeout_s,
        "tags": ["time-to-loss", "gpu"],
    }
    if args.smoke:  # CPU: the service path only (debug shape; TorchTitan trains on GPUs)
        spec |= {
            "name": "time to loss smoke",
            "model": "debug",
            "num_layers": 1,
            "seq_len": 64,
            "compile": False,
            "vocab_size": corpus_vocab(args.data),
        }
    return spec


def wait_or_cancel(client: httpx.Client, exp_id: int, deadline: float) -> dict:
    """Poll until every run ended; at the deadline cancel the experiment (finished runs are kept)."""
    last = ""
    while True:
        exp = client.get(f"/experiments/{exp_id}").json()
        line = f"{exp['status']} {exp['counts']}"
        if line != last:
            print(f"[ttl] {time.strftime('%H:%M:%S')} experiment {exp_id}: {line}", flush=True)
            last = line
        if exp["status"] not in ("queued", "running"):
            return exp
        if time.monotonic() > deadline:
            print(f"[ttl] budget reached: cancelling experiment {exp_id}", flush=True)
            client.post(f"/experiments/{exp_id}/cancel")
            time.sleep(5)
            return client.get(f"/experiments/{exp_id}").json()
        time.sleep(5)


def run_record(detail: dict) -> dict:
    """What the time-to-loss analysis needs of one run, from GET /runs/{id}."""
    spec, result = detail["spec"], detail.get("result") or {}
    numerics, summary = result.get("numerics") or {}, detail.get("summary") or {}
    return {
        "run_id": detail["id"],
        "status": detail["status"],
        "engine": spec.get("engine", "scalebench"),
        "precision": spec["precision"],
        "seed": spec["seed"],
        "repeat": spec.get("repeat", 0),
        "steps": spec["steps"],
        "tokens_per_step": spec["seq_len"]
        * spec["local_batch_size"]
        * spec["degrees"]["dp_replicate"]
        * spec["degrees"]["dp_shard"],
        "model": spec["model"],
        "num_layers": spec["num_layers"],
        "vocab_size": spec.get("vocab_size"),
        "lr": spec["lr"],
        "lr_warmup_steps": spec["lr_warmup_steps"],
        "lr_schedule": spec["lr_schedule"],
        "train_loss": numerics.get("loss_curve") or [],
        "eval_loss": [[p["step"], p["loss"]] for p in numerics.get("eval_curve") or []],
        "data": numerics.get("data"),
        "tokens_per_sec": summary.get("tokens_per_sec"),
        "step_ms_median": summary.get("step_ms_median"),
        "mfu_vs_bf16_peak": summary.get("mfu_vs_bf16_peak"),
        "peak_memory_gib": summary.get("peak_memory_allocated_gib"),
        "throughput_alone": True,  # one worker: runs never share the device
        "environment": result.get("environment"),
        "error": detail.get("error"),
    }


def table(runs: list[dict]) -> str:
    rows = [
        "| engine | precision | seed | steps | train loss (last 50 mean) | held-out loss (last) | tok/s | "
        "step ms (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(
        runs,
        key=lambda r: (
            r["engine"],
            PRECISIONS.index(r["precision"]) if r["precision"] in PRECISIONS else 9,
            r["seed"],
            r.get("repeat", 0),
        ),
    ):
        train = r["train_loss"][-TAIL_STEPS:]
        ev = r["eval_loss"][-1][1] if r["eval_loss"] else None
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        seed = f"{r['seed']} (repeat {r['repeat']})" if r.get("repeat") else str(r["seed"])
        rows.append(
            f"| {r['engine']} | {r['precision']} | {seed} | {len(r['train_loss'])} | "
            f"{fmt(statistics.fmean(train) if train else None, '.4f')} | {fmt(ev, '.4f')} | "
            f"{fmt(r['tokens_per_sec'], ',.0f')} | {fmt(r['step_ms_median'], '.1f')} |"
            + ("" if r["status"] == "succeeded" else f" {r['status']}")
        )
    return "\n".join(rows)


def run_losses(r: dict) -> RunLosses:
    return RunLosses(
        run_id=str(r["run_id"]),
        seed=r["seed"],
        steps=tuple(range(len(r["train_loss"]))),
        losses=tuple(r["train_loss"]),
        eval_steps=tuple(s for s, _ in r["eval_loss"]),
        eval_losses=tuple(v for _, v in r["eval_loss"]),
    )


def pay_off_table(runs: list[dict]) -> str:
    """Per engine and fp8 recipe, the service's own analysis of the recorded curves (every seed against the bf16
    run of the same engine and seed): throughput speedup, steps to bf16's end loss, speedup at equal loss and
    the loss verdict (core.analysis.time_to_loss, core.analysis.numerics)."""
    ok = [r for r in runs if r["status"] == "succeeded" and r["train_loss"]]
    rows = [
        "| engine | precision | seeds | speedup | steps ratio | effective speedup | time to loss | loss verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine in sorted({r["engine"] for r in ok}):
        bf16 = [r for r in ok if r["engine"] == engine and r["precision"] == "bf16"]
        for precision in PRECISIONS[1:]:
            fp8 = [r for r in ok if r["engine"] == engine and r["precision"] == precision]
            if not fp8 or not bf16:
                continue
            x = statistics.fmean(r["tokens_per_sec"] for r in fp8) / statistics.fmean(r["tokens_per_sec"] for r in bf16)
            ttl = time_to_loss(
                [run_losses(r) for r in fp8],
                [run_losses(r) for r in bf16],
                speedup=x,
                fp8_step_ms=statistics.fmean(r["step_ms_median"] for r in fp8),
                bf16_step_ms=statistics.fmean(r["step_ms_median"] for r in bf16),
            )
            verdict = loss_verdict([run_losses(r) for r in fp8], [run_losses(r) for r in bf16])
            ratio = "-" if ttl.steps_ratio is None else f"{ttl.steps_ratio:.3f}"
            if ttl.steps_ratio is not None and ttl.steps_ratio_band is not None:
                ratio += f" ±{ttl.steps_ratio_band:.3f}"
            rows.append(
                f"| {engine} | {precision} | {ttl.num_seeds} | {x:.3f}x | {ratio} | {short_effective(ttl)} | "
                f"{ttl.reason} | {short_verdict(verdict)} ({verdict.source or '-'} loss) |"
            )
    return "\n".join(rows)


def run_service(args: argparse.Namespace, env: dict[str, str], t0: float) -> dict:
    out = args.out
    (out / "clusters.toml").write_text(clusters_toml(args.device_name, args.smoke, args.data))
    spec = experiment_spec(args)
    (out / "spec.yaml").write_text(json.dumps(spec, indent=1))  # JSON is YAML
    env = env | {"SCALEBENCH_CLUSTERS_FILE": str(out / "clusters.toml")}
    data_dir = Path(env["SCALEBENCH_DATA_DIR"])
    proc, token = start_stack(env, args.port, data_dir / "stack.log")
    url = f"http://127.0.0.1:{args.port}"
    try:
        cli = [sys.executable, "-m", "cli.main", "submit", str(out / "spec.yaml"), "--server", url, "--token", token]
        subprocess.run(cli, cwd=REPO, env=env, check=True)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            exp_id = client.get("/experiments?limit=1").json()["items"][0]["id"]
            exp = wait_or_cancel(client, exp_id, t0 + args.budget_s)
            report = client.get(f"/experiments/{exp_id}/scaling").json()
            runs = client.get(f"/experiments/{exp_id}/runs?limit=100").json()["items"]
            details = [client.get(f"/runs/{r['id']}").json() for r in runs]
            logs = {
                r["id"]: client.get(f"/runs/{r['id']}/log?tail_bytes=4000").text
                for r in runs
                if r["status"] != "succeeded"
            }
        (out / "service_report.json").write_text(json.dumps(report, indent=1))
        return {
            "experiment": {"id": exp_id, "status": exp["status"], "counts": exp["counts"], "spec": spec},
            "runs": [run_record(d) for d in details],
            "failed_logs": logs,
        }
    finally:
        stop_stack(proc)
        shutil.copy(data_dir / "stack.log", out / "stack.log")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "ttl-out")))
    ap.add_argument("--data", type=Path, help="token file built by runner.corpus (.val beside it)")
    ap.add_argument("--from-json", type=Path, help="print the tables of a recorded time_to_loss.json (no run)")
    ap.add_argument("--engine", default="scalebench", choices=("scalebench", "torchtitan"))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every (precision, seed): the same seed again, as a nightly suite",
    )
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=10, help="timing warm-up steps (not in tokens/s)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--lr-warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--device-name", default="NVIDIA H200")
    ap.add_argument("--run-timeout-s", type=int, default=900)
    ap.add_argument("--budget-s", type=float, default=510.0, help="cancel what has not ended after this long")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the whole path (debug shape, 30 steps)")
    args = ap.parse_args()
    if args.from_json:
        record = json.loads(args.from_json.read_text())
        print(table(record["runs"]), pay_off_table(record["runs"]), sep="\n\n")
        return 0
    if args.data is None:
        ap.error("--data is required (or --from-json)")
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.smoke:
        args.device_name, args.steps, args.eval_every, args.lr_warmup, args.warmup = "cpu", 30, 10, 5, 2
        args.precisions = [p for p in args.precisions if p in ("bf16", "fp8-tensorwise")]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    data = Path(tempfile.mkdtemp(prefix="scalebench-"))
    env = dict(os.environ) | {
        "SCALEBENCH_DATA_DIR": str(data),
        "PYTHONUNBUFFERED": "1",
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(data / "inductor-cache")),
    }
    for key in ("SCALEBENCH_DATABASE_URL", "SCALEBENCH_BROKER_URL", "DATABASE_URL", "REDIS_URL"):
        env.pop(key, None)  # the embedded default: SQLite + filesystem broker under the data dir
    record = run_service(args, env, t0)
    recipe_path = args.data.with_suffix(".json")
    record |= {
        "corpus_recipe": json.loads(recipe_path.read_text()) if recipe_path.is_file() else None,
        "command": sys.argv,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    (args.out / "time_to_loss.json").write_text(json.dumps(record, indent=1))
    print(table(record["runs"]), pay_off_table(record["runs"]), sep="\n\n")
    print(f"[ttl] {record['experiment']['status']} after {record['elapsed_s']:.0f} s")
    shutil.rmtree(data, ignore_errors=True)
    return 0 if record["experiment"]["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
