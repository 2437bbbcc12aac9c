"""Queue overhead on Redis + Postgres: POST -> runner start, and runner exit -> result visible in the API.

    .venv/bin/python bench/queue_overhead.py [--runs 20] [--db scalebench_queue_overhead] [--redis redis://127.0.0.1:6379/9]

Starts the real stack (cli.stack.Stack: `alembic upgrade head`, uvicorn, one `celery worker --pool solo`,
the scheduler) on a fresh Postgres database and a flushed Redis db, then submits one tiny CPU run at a time
(the queue is empty: what is measured is overhead, not backlog). Per run, all on this host's clock:

  post_to_claim_s      POST sent -> worker claimed the run (runs.started_at)
  post_to_spawn_s      POST sent -> torchrun spawned by the launcher (handle.json started_at)
  post_to_runner_s     POST sent -> the runner's first log line (includes torchrun + `import torch`)
  exit_to_visible_s    result.json written by rank 0 (its mtime) -> GET /runs/{id} answers succeeded
                       (includes torchrun's teardown of its ranks, the worker's poll, the DB write)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cli.stack import Stack  # noqa: E402
from osutil import procs  # noqa: E402

SPEC = {
    "name": "queue overhead",
    "model": "debug",
    "cluster": "local-cpu",
    "gpu_counts": [1],
    "precisions": ["bf16"],
    "seq_len": 32,
    "local_batch_size": 1,
    "steps": 3,
    "warmup_steps": 1,
    "timeout_s": 300,
}
FIRST_LINE_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank0\]", re.M)
POLL_S = 0.02


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _runner_first_line(log_text: str) -> float | None:
    m = FIRST_LINE_RE.search(log_text)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def measure_one(client: httpx.Client) -> dict[str, float]:
    t_post = time.time()
    created = client.post("/experiments", json=SPEC)
    created.raise_for_status()
    run_id = created.json()["runs"][0]["id"]
    while True:  # poll fast: the moment the API first shows the result is the measurement
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            t_visible = time.time()
            break
        time.sleep(POLL_S)
    assert run["status"] == "succeeded", run.get("error")
    run_dir = Path(run["run_dir"])
    handle = json.loads((run_dir / "handle.json").read_text())
    runner_start = _runner_first_line((run_dir / "log.txt").read_text())
    # Let the node become idle (torchrun's teardown ends after the result is visible): the next POST must
    # measure overhead, not the previous run's tail.
    while procs.pids_with_arg(str(run_dir / "spec.json")):
        time.sleep(POLL_S)
    time.sleep(0.5)
    return {
        "run_id": run_id,
        "post_to_claim_s": _ts(run["started_at"]) - t_post,
        "post_to_spawn_s": handle["started_at"] - t_post,
        "post_to_runner_s": (runner_start - t_post) if runner_start else float("nan"),
        "exit_to_visible_s": t_visible - (run_dir / "result.json").stat().st_mtime,
    }


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "min": ordered[0],
        "max": ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--db", default="scalebench_queue_overhead")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "root",
            "-d",
            "postgres",
            "-q",
            "-c",
            f"DROP DATABASE IF EXISTS {args.db} WITH (FORCE)",
            "-c",
            f"CREATE DATABASE {args.db}",
        ],
        check=True,
    )
    redis.Redis.from_url(args.redis).flushdb()
    data_dir = REPO / ".scalebench" / "bench-queue"
    shutil.rmtree(data_dir, ignore_errors=True)  # run dirs of a previous database would hold old logs
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBENCH_")}
    env |= {
        "DATABASE_URL": f"postgresql+psycopg://root@127.0.0.1:5432/{args.db}",
        "REDIS_URL": args.redis,
        "SCALEBENCH_DATA_DIR": str(data_dir),
    }
    with Stack(port=8765, env=env) as stack:
        headers = {"Authorization": f"Bearer {stack.create_token('bench')}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client:
            measure_one(client)  # warm-up (first imports, connection pools), not counted
            rows = []
            for i in range(args.runs):
                rows.append(measure_one(client))
                print(
                    f"run {i + 1:>2}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items() if k != "run_id"),
                    flush=True,
                )
    keys = ("post_to_claim_s", "post_to_spawn_s", "post_to_runner_s", "exit_to_visible_s")
    summary = {k: _stats([r[k] for r in rows]) for k in keys}
    print(
        f"\n{args.runs} runs, Redis broker {args.redis}, Postgres {args.db}; {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'metric':<20} {'median':>8} {'p90':>8} {'min':>8} {'max':>8}")
    for k in keys:
        s = summary[k]
        print(f"{k:<20} {s['median']:>8.3f} {s['p90']:>8.3f} {s['min']:>8.3f} {s['max']:>8.3f}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
