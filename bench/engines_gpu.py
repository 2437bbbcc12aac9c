"""Engines through the whole service on one GPU node, the way a user does it first, and TorchTitan run directly.

1. `python -m cli.main up` (the embedded stack: API, worker, scheduler; SQLite + filesystem broker) with a
   clusters file describing this node (one GPU, `torchtitan = true`);
2. `python -m cli.main submit SPEC --wait`: engines [scalebench, torchtitan] x bf16 and the three float8 recipes,
   Llama-3-8B dims with --layers layers, --seq-len tokens a step, compile; the CLI prints its tables;
3. the served report (JSON, CSV, PNG) is saved, and the engine ratio R = X_torchtitan / X_scalebench read from it;
4. bench/peer_torchtitan.py --systems titan on the same machine right after, the same shape, warm-up and timed
   steps (the same inductor cache): TorchTitan driven directly, its figure beside the service's;
5. with --project, what a user with one GPU asks next: the measured series projected onto a cluster the clusters
   file describes but no worker serves (128 nodes x 8 of this device, one 400G InfiniBand NIC per GPU), measured
   layout and pp=2 / cp=2 over it, with the 80% interval (GET /experiments/{id}/projection), and
   `scalebench plan` for a 1T-token budget on up to 1,024 of them.

Prints one table: per recipe, scalebench and TorchTitan through the service, R, TorchTitan direct, and
service / direct for TorchTitan. Run from the repository root on the GPU node (wheels: scripts/offline-wheels.sh):

    PYTHONUNBUFFERED=1 python3 bench/engines_gpu.py --out OUT [--layers 16 --steps 16 --warmup 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import start_stack, stop_stack  # noqa: E402
from core.projection.network import PLATFORM_OF_DEVICE  # noqa: E402

RECIPES = {
    "bf16": "bf16",
    "fp8-tensorwise": "tensorwise",
    "fp8-rowwise": "rowwise",
    "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
}  # our precision -> bench/peer_torchtitan.py's recipe


PROJECTION_CLUSTER = "gpu-cluster"  # described for the projection only: no worker consumes its queue
PROJECTION_COUNTS = "8,64,512,1024"
PROJECTION_LAYOUTS = "pp=2+fsdp,cp=2+fsdp"
PLAN_TOKENS, PLAN_MAX_GPUS = "1T", 1024


def clusters_toml(device_name: str, smoke: bool, project: bool = False) -> str:
    vendor, titan = ("cpu", "false") if smoke else ("nvidia", "true")
    text = (
        f'[[cluster]]\nname = "gpu-node"\nvendor = "{vendor}"\ndevice_name = "{device_name}"\n'
        f'gpus_per_node = 1\nmax_nodes = 1\nlauncher = "local"\ntorchtitan = {titan}\n'
    )
    if project:
        # the platform this device sits on (the CPU smoke check borrows the H200's), one 400G NIC per GPU
        platform = next((p for match, p in PLATFORM_OF_DEVICE if match in device_name.lower()), "h200-hgx")
        text += (
            f'\n[[cluster]]\nname = "{PROJECTION_CLUSTER}"\nvendor = "{vendor}"\ndevice_name = "{device_name}"\n'
            f'gpus_per_node = 8\nmax_nodes = 128\nlauncher = "slurm"\n\n'
            f'[cluster.network]\nplatform = "{platform}"\nnic = "ib-400g"\n'
        )
    return text


def spec_yaml(args: argparse.Namespace) -> str:
    spec = {
        "name": f"engines: scalebench vs torchtitan, 8b x{args.layers}, {args.seq_len} tokens",
        "model": "8b",
        "num_layers": args.layers,
        "cluster": "gpu-node",
        "gpu_counts": [1],
        "engines": ["scalebench", "torchtitan"],
        "precisions": list(RECIPES),
        "layouts": ["fsdp"],
        "seq_len": args.seq_len,
        "local_batch_size": 1,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "compile": True,
        "timeout_s": args.run_timeout_s,
        "tags": ["engines", "gpu"],
    }
    if args.smoke:  # CPU: the service path only (TorchTitan trains on GPUs)
        spec |= {
            "name": "engines smoke",
            "model": "debug",
            "num_layers": 1,
            "engines": ["scalebench"],
            "precisions": ["fp32", "fp8-tensorwise"],
            "seq_len": 64,
            "compile": False,
        }
    return json.dumps(spec, indent=1)  # JSON is YAML


def run_service(args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict:
    (out / "clusters.toml").write_text(clusters_toml(args.device_name, args.smoke, args.project))
    (out / "spec.yaml").write_text(spec_yaml(args))
    env = env | {"SCALEBENCH_CLUSTERS_FILE": str(out / "clusters.toml")}
    proc, token = start_stack(env, args.port, out / "stack.log")
    url = f"http://127.0.0.1:{args.port}"
    try:
        t0 = time.monotonic()
        cli = [
            sys.executable,
            "-m",
            "cli.main",
            "submit",
            str(out / "spec.yaml"),
            "--wait",
            "--server",
            url,
            "--token",
            token,
        ]
        code = subprocess.run(cli, cwd=REPO, env=env).returncode
        print(f"[engines] submit --wait exited {code} after {time.monotonic() - t0:.0f} s", flush=True)
        headers = {"Authorization": f"Bearer {token}"}
        exp_id = httpx.get(f"{url}/experiments?limit=1", headers=headers).json()["items"][0]["id"]
        report = httpx.get(f"{url}/experiments/{exp_id}/scaling", headers=headers).json()
        (out / "service_report.json").write_text(json.dumps(report, indent=1))
        (out / "service_scaling.csv").write_text(
            httpx.get(f"{url}/experiments/{exp_id}/scaling?format=csv", headers=headers).text
        )
        (out / "service_scaling.png").write_bytes(
            httpx.get(f"{url}/experiments/{exp_id}/scaling.png", headers=headers).content
        )
        runs = httpx.get(f"{url}/experiments/{exp_id}/runs?limit=100", headers=headers).json()["items"]
        details = [httpx.get(f"{url}/runs/{r['id']}", headers=headers).json() for r in runs]
        (out / "service_runs.json").write_text(json.dumps(details, indent=1))
        if args.project:
            project(url, token, headers, exp_id, out, env)
        return report
    finally:
        stop_stack(proc)


def project(url: str, token: str, headers: dict[str, str], exp_id: int, out: Path, env: dict[str, str]) -> None:
    """The measured series projected onto PROJECTION_CLUSTER (JSON), and `scalebench plan` on it (its tables, and
    the plan as JSON)."""
    query = {"cluster": PROJECTION_CLUSTER, "gpu_counts": PROJECTION_COUNTS, "layouts": PROJECTION_LAYOUTS}
    r = httpx.get(f"{url}/experiments/{exp_id}/projection", params=query, headers=headers, timeout=120)
    r.raise_for_status()
    (out / "projection.json").write_text(json.dumps(r.json(), indent=1))
    plan_query = {"cluster": PROJECTION_CLUSTER, "tokens": PLAN_TOKENS, "max_gpus": PLAN_MAX_GPUS}
    r = httpx.get(f"{url}/experiments/{exp_id}/plan", params=plan_query, headers=headers, timeout=120)
    r.raise_for_status()
    (out / "plan.json").write_text(json.dumps(r.json(), indent=1))
    cli = [sys.executable, "-m", "cli.main", "plan", str(exp_id), "--tokens", PLAN_TOKENS, "--max-gpus"]
    cli += [str(PLAN_MAX_GPUS), "--cluster", PROJECTION_CLUSTER, "--server", url, "--token", token]
    code = subprocess.run(cli, cwd=REPO, env=env).returncode
    print(f"[engines] scalebench plan exited {code}", flush=True)


def projection_table(projection: dict) -> str:
    """Markdown: per projected series, X(N0) measured and E(N) with its 80% interval at each projected N."""
    counts = [int(n) for n in PROJECTION_COUNTS.split(",")]
    rows = [
        "| engine | precision | layout | X(N0) tok/s | " + " | ".join(f"E({n}) [80%]" for n in counts) + " |",
        "|---|---|---|---|" + "---|" * len(counts),
    ]
    for s in projection["series"]:
        key, at = s["key"], {p["num_devices"]: p for p in s["points"] if p.get("status") == "projected"}
        cells = []
        for n in counts:
            p = at.get(n)
            lo, hi = (p or {}).get("efficiency_low"), (p or {}).get("efficiency_high")
            band = f" [{lo:.1%}, {hi:.1%}]" if lo is not None and hi is not None else ""
            cells.append("-" if p is None else f"{p['efficiency']:.1%}{band}")
        x0 = s.get("baseline_tokens_per_sec")
        rows.append(
            f"| {key['engine']} | {key['precision']} | {key['layout']} | "
            f"{'-' if x0 is None else format(x0, ',.0f')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(rows)


def run_direct(args: argparse.Namespace, out: Path, env: dict[str, str]) -> list[dict]:
    """TorchTitan driven directly by bench/peer_torchtitan.py (same shape, warm-up and timed steps)."""
    work = Path(tempfile.mkdtemp(prefix="peer-"))
    cmd = [
        sys.executable,
        str(REPO / "bench" / "peer_torchtitan.py"),
        "--out",
        str(out / "direct"),
        "--work",
        str(work),
        "--systems",
        "titan",
        "--recipes",
        ",".join(RECIPES.values()),
        "--layers",
        str(args.layers),
        "--seq-len",
        str(args.seq_len),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps - args.warmup),
        "--loss-steps",
        "0",
        "--budget-s",
        str(args.direct_budget_s),
        "--job-timeout-s",
        "180",
        "--min-job-s",
        "30",
    ]
    print("[engines] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, env=env)
    path = out / "direct" / "peer_results.json"
    return json.loads(path.read_text()) if path.is_file() else []


def table(report: dict, direct: list[dict], seq_len: int) -> str:
    """Markdown: per recipe, both engines through the service, R(N=1), TorchTitan direct, service / direct."""
    x = {(s["key"]["engine"], s["key"]["precision"]): s["points"][0].get("tokens_per_sec") for s in report["series"]}
    ratio = {r["precision"]: r["ratio"] for r in report.get("engine_ratios", [])}
    titan = {d["recipe"]: seq_len / (d["step_ms_median"] / 1000.0) for d in direct if d.get("ok")}
    rows = [
        "| precision | scalebench tok/s (service) | torchtitan tok/s (service) | R = titan / scalebench | "
        "torchtitan tok/s (direct) | titan service / direct |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for precision, recipe in RECIPES.items():
        ts, td = x.get(("torchtitan", precision)), titan.get(recipe)
        rows.append(
            f"| {precision} | {fmt(x.get(('scalebench', precision)), ',.0f')} | {fmt(ts, ',.0f')} | "
            f"{fmt(ratio.get(precision), '.3f')} | {fmt(td, ',.0f')} | "
            f"{fmt(ts / td if ts and td else None, '.3f')} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "engines-out")))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--device-name", default="NVIDIA H200")
    ap.add_argument("--run-timeout-s", type=int, default=300)
    ap.add_argument("--direct-budget-s", type=float, default=200.0, help="bench/peer_torchtitan.py's --budget-s")
    ap.add_argument("--skip-direct", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the service path (debug shape, no TorchTitan)")
    ap.add_argument(
        "--project",
        action="store_true",
        help=f"also project onto {PROJECTION_CLUSTER} (128 nodes x 8 of this device) and plan {PLAN_TOKENS} tokens",
    )
    args = ap.parse_args()
    if args.smoke:
        args.skip_direct, args.device_name = True, "cpu"
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
    report = run_service(args, args.out, env)
    print(f"[engines] service part done at {time.monotonic() - t0:.0f} s", flush=True)
    direct = [] if args.skip_direct else run_direct(args, args.out, env)
    print(f"[engines] all done at {time.monotonic() - t0:.0f} s", flush=True)
    text = table(report, direct, args.seq_len)
    if args.project and (args.out / "projection.json").is_file():
        text += "\n\n" + projection_table(json.loads((args.out / "projection.json").read_text()))
    (args.out / "engines_table.md").write_text(text + "\n")
    print(text)
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
