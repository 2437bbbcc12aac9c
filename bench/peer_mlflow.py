"""scalebench against MLflow, side by side on the same machine, database server and data (a script, not a test).

Both services get the same seeded experiment (bench/scaling_load.py's seed: 2,000 runs, ~1% failed, 100 loss
points each) in PostgreSQL databases of their own, and two server workers each (uvicorn for scalebench;
MLflow's own `mlflow server --workers 2`). MLflow is installed into its own virtualenv by this script
(`pip install mlflow==VERSION psycopg2-binary` from PyPI into .scalebench/mlflow-venv). One driver process,
running in that virtualenv, copies the data into MLflow through its REST API and then measures, A/B
interleaved (the order flips every iteration, so drift of the shared machine hits both sides alike):

- all runs + scaling table: MLflow `search_runs` (every run, paged) + a pandas table of the median X(N)
  per series and N with E(N); scalebench GET /experiments/{id}/scaling cold (another full_size each time:
  the answer is rebuilt; aggregated point values and fits of unchanged series are reused) and warm (the
  answer cache). Client-side parsing (pandas / JSON) is inside the timed span on both sides.
- 20 loss curves (the 20 runs at N=8): MLflow 20 x get-history, and the bulk-interval endpoint;
  scalebench GET /experiments/{id}/losses?num_devices=8, cold (another max_points each time) and warm.
- 20 concurrent clients (threads) for --duration-s, --rounds times each in the order MLflow, scalebench
  cold, scalebench warm: loads or requests per second (a phase ends when its last request in flight
  does: an MLflow load under 20 clients takes ~100 s here, so each MLflow round takes that long).

    python bench/peer_mlflow.py [--iterations 10] [--duration-s 10] [--rounds 1] [--mlflow-version 3.17.2]

About 7-8 minutes on the 2-core machine with --rounds 1 (2 rounds: ~10 minutes).

It creates (drops first) the databases scalebench_bench_peer and scalebench_peer_mlflow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".scalebench" / "mlflow-venv"
SCALEBENCH_DB = "scalebench_bench_peer"
MLFLOW_DB = "scalebench_peer_mlflow"
MLFLOW_DB_URI = f"postgresql+psycopg2://root@127.0.0.1:5432/{MLFLOW_DB}"
CURVE_NUM_DEVICES = 8
NUM_CLIENTS = 20


# ------------------------------------------------------------------------------------ driver (MLflow venv)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Driver:
    """Runs in the MLflow virtualenv: loads the data into MLflow and measures both services."""

    def __init__(self, mlflow_url: str, scalebench_url: str, experiment_id: int):
        import mlflow
        import requests
        from mlflow.tracking import MlflowClient

        self.mlflow, self.client = mlflow, MlflowClient(tracking_uri=mlflow_url)
        mlflow.set_tracking_uri(mlflow_url)
        self.mlflow_url, self.sb_url, self.sb_exp = mlflow_url, scalebench_url, experiment_id
        self.requests, self._local = requests, threading.local()
        self.counter = iter(range(10**9))
        self.lock = threading.Lock()

    def _http(self):
        if not hasattr(self._local, "s"):
            self._local.s = self.requests.Session()
        return self._local.s

    def _next(self) -> int:
        with self.lock:
            return next(self.counter)

    def load(self, runs: list[dict], db_uri: str) -> None:
        """One MLflow run per scalebench run: its matrix coordinates as params, summary values as metrics,
        the loss curve as the history of metric `loss`, and FINISHED or FAILED. Written through MLflow's
        own store on the server's database (the REST API is the same code behind HTTP, minutes slower)."""
        from mlflow.entities import Metric, Param, RunStatus
        from mlflow.tracking import MlflowClient

        store = MlflowClient(tracking_uri=db_uri)
        self.exp = store.create_experiment("scalebench-peer")
        now_ms = int(time.time() * 1000)

        def one(r: dict) -> tuple[int, str]:
            run = store.create_run(self.exp, run_name=f"run-{r['id']}")
            params = [
                Param(k, str(r[k]))
                for k in ("model", "num_layers", "precision", "layout", "scaling", "cluster", "num_devices", "repeat")
            ]
            metrics = [Metric(k, float(v), now_ms, 0) for k, v in r["summary"].items() if v is not None]
            metrics += [Metric("loss", v, now_ms + i, i) for i, v in enumerate(r["losses"])]
            store.log_batch(run.info.run_id, metrics=metrics, params=params)
            status = RunStatus.to_string(RunStatus.FINISHED if r["status"] == "succeeded" else RunStatus.FAILED)
            store.set_terminated(run.info.run_id, status=status)
            return r["id"], run.info.run_id

        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            self.run_ids = dict(pool.map(one, runs))
        self.curve_runs = [
            self.run_ids[r["id"]] for r in runs if r["num_devices"] == CURVE_NUM_DEVICES and r["repeat"] == 0
        ]
        print(f"loaded {len(runs)} runs into MLflow in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    # --- the operations measured

    def mlflow_table(self) -> None:
        """Every run (search_runs pages through them) and the scaling table a dashboard shows."""
        df = self.mlflow.search_runs(experiment_ids=[self.exp], max_results=100_000)
        ok = df[df["status"] == "FINISHED"].copy()
        ok["n"] = ok["params.num_devices"].astype(int)
        keys = [
            "params.model",
            "params.num_layers",
            "params.precision",
            "params.layout",
            "params.scaling",
            "params.cluster",
        ]
        table = (
            ok.groupby([*keys, "n"])
            .agg(
                tokens_per_sec=("metrics.tokens_per_sec", "median"),
                tokens_per_sec_min=("metrics.tokens_per_sec", "min"),
                tokens_per_sec_max=("metrics.tokens_per_sec", "max"),
                step_ms=("metrics.step_ms_median", "median"),
                mfu=("metrics.mfu_vs_bf16_peak", "median"),
                final_loss=("metrics.final_loss", "median"),
                num_succeeded=("run_id", "count"),
            )
            .reset_index()
        )
        x0 = table.groupby(keys)["tokens_per_sec"].transform("first")
        n0 = table.groupby(keys)["n"].transform("first")
        table["efficiency"] = table["tokens_per_sec"] / (x0 * table["n"] / n0)
        assert len(table) > 0

    def mlflow_histories(self) -> None:
        for run_id in self.curve_runs:
            assert self.client.get_metric_history(run_id, "loss")

    def mlflow_bulk(self) -> None:
        r = self._http().get(
            f"{self.mlflow_url}/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval",
            params={"run_ids": self.curve_runs, "metric_key": "loss", "max_results": 200},
        )
        r.raise_for_status()
        assert r.json()["metrics"]

    def _sb(self, path: str) -> None:
        r = self._http().get(self.sb_url + path, timeout=120)
        r.raise_for_status()
        r.json()

    def sb_cold(self) -> None:
        self._sb(f"/experiments/{self.sb_exp}/scaling?full_size={100_000 + self._next()}")

    def sb_warm(self) -> None:
        self._sb(f"/experiments/{self.sb_exp}/scaling")

    def sb_losses_cold(self) -> None:
        max_points = 1000 + self._next() % 1000  # another answer each time
        self._sb(f"/experiments/{self.sb_exp}/losses?num_devices={CURVE_NUM_DEVICES}&max_points={max_points}")

    def sb_losses_warm(self) -> None:
        self._sb(f"/experiments/{self.sb_exp}/losses?num_devices={CURVE_NUM_DEVICES}")

    # --- phases

    def interleaved(self, ops: dict[str, callable], iterations: int) -> dict[str, dict]:
        for fn in ops.values():
            fn()  # warm-up: imports, connections, plans
        times: dict[str, list[float]] = {k: [] for k in ops}
        names = list(ops)
        for i in range(iterations):
            for name in names if i % 2 == 0 else names[::-1]:
                times[name].append(_timed(ops[name]))
        return {
            k: {"p50_ms": 1000 * statistics.median(v), "min_ms": 1000 * min(v), "max_ms": 1000 * max(v), "n": len(v)}
            for k, v in times.items()
        }

    def concurrent(self, fn, duration_s: float) -> dict:
        latencies: list[float] = []
        errors = 0
        stop = time.perf_counter() + duration_s

        def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 -- any failure is a result here: counted, first ones shown
                    errors += 1
                    if errors <= 3:
                        print(f"  {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
                    continue
                latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(NUM_CLIENTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        return {
            "per_s": len(latencies) / wall,
            "done": len(latencies),
            "errors": errors,
            "wall_s": wall,
            "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        }


def drive(args: argparse.Namespace) -> None:
    runs = json.loads(Path(args.data).read_text())
    d = Driver(args.mlflow_url, args.scalebench_url, args.experiment_id)
    d.load(runs, args.mlflow_db)
    out = {"load_avg_start": os.getloadavg()}
    out["table"] = d.interleaved(
        {"mlflow": d.mlflow_table, "sb_cold": d.sb_cold, "sb_warm": d.sb_warm}, args.iterations
    )
    print(f"table: {json.dumps(out['table'])}", file=sys.stderr, flush=True)
    out["curves"] = d.interleaved(
        {
            "mlflow_each": d.mlflow_histories,
            "mlflow_bulk": d.mlflow_bulk,
            "sb_cold": d.sb_losses_cold,
            "sb_warm": d.sb_losses_warm,
        },
        args.iterations,
    )
    print(f"curves: {json.dumps(out['curves'])}", file=sys.stderr, flush=True)
    rounds: dict[str, list[dict]] = {"mlflow": [], "sb_cold": [], "sb_warm": []}
    for _ in range(args.rounds):
        for name, fn in (("mlflow", d.mlflow_table), ("sb_cold", d.sb_cold), ("sb_warm", d.sb_warm)):
            rounds[name].append(d.concurrent(fn, args.duration_s))
            print(f"x{NUM_CLIENTS} {name}: {json.dumps(rounds[name][-1])}", file=sys.stderr, flush=True)
    out["concurrent"] = rounds
    out["load_avg_end"] = os.getloadavg()
    out["versions"] = {"mlflow": d.mlflow.__version__, "pandas": __import__("pandas").__version__}
    print(json.dumps(out))


# ----------------------------------------------------------------------------------- setup (repo venv)


def ensure_mlflow(version: str) -> Path:
    """The virtualenv's python with mlflow==version and psycopg2 installed (created or fixed here)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = subprocess.run(
        [str(python), "-c", "import mlflow, psycopg2; print(mlflow.__version__)"], capture_output=True, text=True
    )
    if probe.returncode != 0 or probe.stdout.strip() != version:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"mlflow=={version}", "psycopg2-binary"], check=True)
    return python


def export_runs(url: str, experiment_id: int) -> list[dict]:
    """The seeded runs as the MLflow side receives them: coordinates, status, summary values, loss curve."""
    import sqlalchemy as sa

    from db.models import Run, StepMetric
    from db.points import load_run_points
    from db.session import make_engine, make_session_factory

    engine = make_engine(url)
    with make_session_factory(engine)() as s:
        points = {p.run_id: p for p in load_run_points(s, experiment_id)}
        repeats = dict(s.execute(sa.select(Run.id, Run.repeat).where(Run.experiment_id == experiment_id)).all())
        losses: dict[int, list[float]] = {}
        for run_id, loss in s.execute(
            sa.select(StepMetric.run_id, StepMetric.loss)
            .join(Run)
            .where(Run.experiment_id == experiment_id)
            .order_by(StepMetric.run_id, StepMetric.step)
        ):
            losses.setdefault(run_id, []).append(loss)
    engine.dispose()
    return [
        {
            "id": i,
            "model": p.model,
            "num_layers": p.num_layers,
            "precision": p.precision,
            "layout": p.layout,
            "scaling": p.scaling,
            "cluster": p.cluster,
            "num_devices": p.num_devices,
            "repeat": repeats[i],
            "status": p.status,
            "losses": losses.get(i, []),
            "summary": {
                "tokens_per_sec": p.tokens_per_sec,
                "step_ms_median": p.step_ms_median,
                "mfu_vs_bf16_peak": p.mfu_vs_bf16_peak,
                "peak_memory_allocated_gib": p.peak_memory_allocated_gib,
                "final_loss": p.final_loss,
            },
        }
        for i, p in points.items()
    ]


def start_mlflow(python: Path, port: int, workers: int, artifacts: str) -> subprocess.Popen:
    import sqlalchemy as sa

    from bench.common import HEALTHCHECK, PG_ADMIN, wait_until_serving

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {MLFLOW_DB} WITH (FORCE)"))
        conn.execute(sa.text(f"CREATE DATABASE {MLFLOW_DB}"))
    admin.dispose()
    cmd = [
        str(python),
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        MLFLOW_DB_URI,
        "--default-artifact-root",
        artifacts,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--uvicorn-opts",
        " ".join(HEALTHCHECK),
    ]  # the same supervisor settings as scalebench's uvicorn
    # The server's background job runners (huey consumers) have no part in tracking reads: off, so that
    # they take no CPU. A session of its own, so that the whole process group is stopped at the end.
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(Path(artifacts) / "server.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
    return wait_until_serving(
        proc, f"http://127.0.0.1:{port}/health", 300, f"mlflow server (log {artifacts}/server.log)"
    )


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:,.0f}x" if a and b else "-"


def table(r: dict) -> str:
    t, c, k = r["table"], r["curves"], r["concurrent"]
    ml_rate = [x["per_s"] for x in k["mlflow"]]
    cold_rate, warm_rate = [x["per_s"] for x in k["sb_cold"]], [x["per_s"] for x in k["sb_warm"]]
    errs = {name: sum(x["errors"] for x in rs) for name, rs in k.items()}

    def span(xs: list[float]) -> str:
        return f"{min(xs):,.1f}-{max(xs):,.1f}" if len(xs) > 1 else f"{xs[0]:,.1f}"

    rows = [
        "| query | MLflow | scalebench | ratio |",
        "|---|---|---|---|",
        f"| all runs + scaling table, single client p50 | {t['mlflow']['p50_ms']:,.0f} ms (search_runs + pandas table) "
        f"| cold /scaling {t['sb_cold']['p50_ms']:,.1f} ms, warm {t['sb_warm']['p50_ms']:,.1f} ms "
        f"| {_ratio(t['mlflow']['p50_ms'], t['sb_cold']['p50_ms'])} cold, "
        f"{_ratio(t['mlflow']['p50_ms'], t['sb_warm']['p50_ms'])} warm |",
        f"| 20 loss curves p50 | {c['mlflow_each']['p50_ms']:,.0f} ms (20 x get-history), "
        f"{c['mlflow_bulk']['p50_ms']:,.0f} ms (bulk) | cold /losses {c['sb_cold']['p50_ms']:,.1f} ms, "
        f"warm {c['sb_warm']['p50_ms']:,.1f} ms | {_ratio(c['mlflow_each']['p50_ms'], c['sb_cold']['p50_ms'])} / "
        f"{_ratio(c['mlflow_bulk']['p50_ms'], c['sb_cold']['p50_ms'])} cold, "
        f"{_ratio(c['mlflow_each']['p50_ms'], c['sb_warm']['p50_ms'])} / "
        f"{_ratio(c['mlflow_bulk']['p50_ms'], c['sb_warm']['p50_ms'])} warm |",
        f"| {NUM_CLIENTS} concurrent clients, all runs + table | {span(ml_rate)} loads/s ({errs['mlflow']} errors) "
        f"| cold {span(cold_rate)} req/s, warm {span(warm_rate)} req/s ({errs['sb_cold'] + errs['sb_warm']} errors) "
        f"| {_ratio(statistics.mean(cold_rate), statistics.mean(ml_rate))} cold, "
        f"{_ratio(statistics.mean(warm_rate), statistics.mean(ml_rate))} warm |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10, help="A/B iterations of the single-client phases")
    parser.add_argument("--duration-s", type=float, default=10.0, help="each concurrent phase (run twice)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the concurrent phases")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes of each service")
    parser.add_argument("--mlflow-version", default="3.17.2")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)  # the MLflow-venv side
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--mlflow-url", help=argparse.SUPPRESS)
    parser.add_argument("--mlflow-db", help=argparse.SUPPRESS)
    parser.add_argument("--scalebench-url", help=argparse.SUPPRESS)
    parser.add_argument("--experiment-id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        drive(args)
        return

    sys.path.insert(0, str(REPO))
    from bench.common import free_port, fresh_database, start_uvicorn, versions
    from bench.scaling_load import CLUSTERS_TOML, REDIS_URL, seed

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup when stopped (e.g. by timeout)
    t0 = time.perf_counter()
    python = ensure_mlflow(args.mlflow_version)
    url = fresh_database(SCALEBENCH_DB)
    exp_id, _ = seed(url, 2000, 0)
    work = Path(tempfile.mkdtemp(prefix="peer-mlflow-"))
    (work / "runs.json").write_text(json.dumps(export_runs(url, exp_id)))
    (work / "clusters.toml").write_text(CLUSTERS_TOML)
    os.environ["SCALEBENCH_DATA_DIR"] = str(work / "data")
    sb_port, ml_port = free_port(), free_port()
    servers = [start_uvicorn(url, REDIS_URL, str(work / "clusters.toml"), sb_port, args.workers)]
    try:
        servers.append(start_mlflow(python, ml_port, args.workers, str(work)))
        print(f"{os.cpu_count()} cores, load avg {os.getloadavg()}; {versions()}", flush=True)
        driver = subprocess.run(
            [
                str(python),
                __file__,
                "--driver",
                "--data",
                str(work / "runs.json"),
                "--mlflow-url",
                f"http://127.0.0.1:{ml_port}",
                "--mlflow-db",
                MLFLOW_DB_URI,
                "--scalebench-url",
                f"http://127.0.0.1:{sb_port}",
                "--experiment-id",
                str(exp_id),
                "--iterations",
                str(args.iterations),
                "--duration-s",
                str(args.duration_s),
                "--rounds",
                str(args.rounds),
            ],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(30)
        if len(servers) > 1:
            with contextlib.suppress(ProcessLookupError):  # what is left of the MLflow server's group
                os.killpg(servers[1].pid, signal.SIGTERM)
    result = json.loads(driver.stdout.strip().splitlines()[-1])
    print(
        f"mlflow {result['versions']['mlflow']}, pandas {result['versions']['pandas']}; load avg at start "
        f"{result['load_avg_start']}, at end {result['load_avg_end']}; {time.perf_counter() - t0:.0f} s in all"
    )
    print(json.dumps(result))
    print(table(result))


if __name__ == "__main__":
    main()
