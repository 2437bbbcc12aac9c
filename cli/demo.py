"""`make demo`: the embedded stack, one CPU scaling experiment, its tables and curves, a clean shutdown.

    .venv/bin/python -m cli.demo [--spec examples/cpu-demo.yaml] [--out demo-out]

Always the embedded default (SQLite + filesystem broker in .scalebench/demo, wiped first), on a free port,
so that it runs beside anything else. Writes demo-out/scaling.png and demo-out/report.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from rich.text import Text

from cli.client import ApiClient, CliError
from cli.plot import fetch_png
from cli.report import fetch_projection, fetch_report, print_report
from cli.runs import console, load_spec, submit_spec, wait_for
from cli.stack import REPO_ROOT, Stack
from core.analysis.scaling import ScalingReport

log = logging.getLogger(__name__)
EMBEDDED_OVERRIDES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SCALEBENCH_DATABASE_URL",
    "SCALEBENCH_BROKER_URL",
    "SCALEBENCH_CLUSTERS_FILE",
    "SCALEBENCH_RUNS_DIR",
)
DEMO_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _demo_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_OVERRIDES}
    env["SCALEBENCH_DATA_DIR"] = str(data_dir)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO_ROOT / ".scalebench" / "inductor-cache"))
    return env


def _write_outputs(client: ApiClient, experiment_id: int, report: ScalingReport, out_dir: Path) -> list[Path]:
    """report.json (the served report) and scaling.png (drawn by the API: GET /experiments/{id}/scaling.png)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json", out_dir / "scaling.png"]
    paths[0].write_text(json.dumps(report.model_dump(mode="json"), indent=1))
    paths[1].write_bytes(fetch_png(client, experiment_id))
    return paths


def run_demo(spec_path: Path, out_dir: Path, data_dir: Path) -> int:
    t0 = time.monotonic()
    spec = load_spec(spec_path)
    shutil.rmtree(data_dir, ignore_errors=True)
    console.print(f"scalebench demo: starting the embedded stack (SQLite + filesystem broker in {data_dir})")
    with Stack(port=_free_port(), env=_demo_env(data_dir)) as stack:
        console.print(
            f"API {stack.url}, one worker on queues {', '.join(stack.queues)}, scheduler; "
            f"up in {time.monotonic() - t0:.1f} s"
        )
        with ApiClient(stack.url, stack.create_token("demo")) as client:
            created = submit_spec(client, spec)
            exp = wait_for(client, created["id"], timeout_s=DEMO_TIMEOUT_S)
            report, runs = fetch_report(client, created["id"])
            projection = fetch_projection(client, created["id"])
            paths = _write_outputs(client, created["id"], report, out_dir)
        print_report(console, report, runs, projection=projection)
        console.print(f"experiment {exp['id']}: {exp['status']}; wrote {', '.join(str(p) for p in paths)}")
        console.print("stopping the stack ...")
    console.print(f"stopped cleanly; demo wall time {time.monotonic() - t0:.0f} s")
    return 0 if exp["status"] == "succeeded" else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "examples" / "cpu-demo.yaml")
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    parser.add_argument("--data-dir", type=Path, default=Path(".scalebench") / "demo")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = run_demo(args.spec, args.out, args.data_dir.resolve())
    except (CliError, RuntimeError) as exc:
        console.print(Text.assemble(("demo failed:", "red"), f" {exc}"), highlight=False)
        code = 1
    except KeyboardInterrupt:
        console.print("interrupted; the stack was stopped")
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
