"""Issue-8 scaling sweep through the service path, on the GPUs of one machine.

    PYTHONUNBUFFERED=1 python3 bench/scaling_sweep.py --config examples/h200-scaling.yaml --out $OUT   # GPU host
    python bench/scaling_sweep.py --smoke --out /tmp/sweep-smoke          # CPU: debug shape, gloo, N in 1, 2
    python bench/scaling_sweep.py --record DIR --png bench/results/x.png  # here: import DIR's payloads via the API

Sweep: the YAML's ExperimentSpecs -> core.contracts.matrix.expand against the YAML's cluster (gpus_per_node = the
devices torch sees) -> every RunSpec whose N fits the devices present, deduplicated by run key, smallest N
and bf16 first (its compile warms TORCHINDUCTOR_CACHE_DIR) -> `python3 -m torch.distributed.run --standalone
--nproc-per-node N -m runner --spec spec.json --out result.json` (worker/launchers/local.py's command and
environment: NCCL_* and friends pass through) -> RunResults -> core.analysis.scaling.build_report (X, E, S, MFU,
memory) -> api.plots.render_scaling_png. Writes under --out: results.json (specs, results, not-run points),
report.json, scaling.png, import-<i>.json (bodies for POST /experiments/import), table.txt. The table is
printed last. Points with N above the devices present are listed as not run, with the reason.

Record (--record): a fresh SQLite store under /tmp (alembic upgrade head), a token, the FastAPI app in-process
(TestClient): POST each import-*.json, GET its scaling report and scaling.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.analysis.scaling import RunPoint, ScalingReport, build_report  # noqa: E402
from core.contracts.clusters import Cluster  # noqa: E402
from core.contracts.matrix import expand  # noqa: E402
from core.contracts.specs import ExperimentSpec, RunError, RunResult, RunSpec  # noqa: E402

log = logging.getLogger("scaling_sweep")
PRECISION_ORDER = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp", "fp32")
SMOKE = {
    "model": "debug",
    "num_layers": 2,
    "seq_len": 64,
    "steps": 4,
    "warmup_steps": 1,
    "lr_warmup_steps": 0,
    "compile": False,
    "timeout_s": 120,
}
REPORT_RESERVE_S = 20.0  # kept back from the budget for the report, the PNG and the payloads


# ------------------------------------------------------------------------------------------ plan


def load_config(path: Path, *, smoke: bool, num_devices: int) -> tuple[Cluster, list[ExperimentSpec], int | None]:
    """Cluster (sized to the devices present) and ExperimentSpecs from the YAML; --smoke shrinks them for CPU."""
    raw = yaml.safe_load(path.read_text())
    cdef = dict(raw["cluster"])
    cdef["gpus_per_node"] = num_devices if cdef.get("gpus_per_node") == "auto" else cdef["gpus_per_node"]
    if smoke:
        cdef.update(vendor="cpu", device_name="cpu (gloo ranks)")
    cluster = Cluster.model_validate(cdef)
    exps = [ExperimentSpec.model_validate({**e, **(SMOKE if smoke else {})}) for e in raw["experiments"]]
    fallback = None if smoke else raw.get("fallback_num_layers")
    return cluster, exps, fallback


def plan(cluster: Cluster, exps: list[ExperimentSpec], num_devices: int):
    """(runs to make, in order; [(experiment index, RunSpec)] per experiment; not-run lines; impossible lines).

    Expansion is against the cluster at the issue's full size, so that points beyond the devices present
    are named ('not run: only K GPUs present') apart from points the matrix itself refuses."""
    full = cluster.model_copy(update={"gpus_per_node": max(num_devices, *(max(e.gpu_counts) for e in exps))})
    unique: dict[tuple[str, int], RunSpec] = {}
    members: list[tuple[int, RunSpec]] = []
    not_run: dict[tuple[str, str], list[int]] = {}
    impossible: list[str] = []
    for i, exp in enumerate(exps):
        runs, skipped = expand(exp, full)
        impossible += [f"{s.precision}/{s.layout}/N={s.num_devices}: {s.reason}" for s in skipped]
        for r in runs:
            members.append((i, r))
            if r.num_devices > num_devices:
                ns = not_run.setdefault((r.precision, r.layout), [])
                ns += [] if r.num_devices in ns else [r.num_devices]
            else:
                unique.setdefault((r.run_key(), r.repeat), r)
    order = sorted(
        unique.values(),
        key=lambda r: (r.num_devices, PRECISION_ORDER.index(r.precision), r.layout != "fsdp", r.layout, r.repeat),
    )
    lines = [
        f"{p}/{lay} N={','.join(map(str, ns))}: only {num_devices} GPUs present" for (p, lay), ns in not_run.items()
    ]
    return order, members, lines, list(dict.fromkeys(impossible))


# ------------------------------------------------------------------------------------------- run


def launch_env(spec: RunSpec, cpu_count: int) -> dict[str, str]:
    """As worker/launchers/local.py: the environment passes through (NCCL_NVLS_ENABLE etc. stay as set)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if spec.device_type == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // spec.num_devices))
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def failed(spec: RunSpec, kind: str, message: str) -> RunResult:
    return RunResult(run_key=spec.run_key(), status="failed", error=RunError(kind=kind, message=message[:20000]))


def run_one(spec: RunSpec, run_dir: Path, timeout_s: float) -> tuple[RunResult, float, str]:
    """One torchrun in its own process group, killed (the group) past timeout_s. (result, wall s, log tail)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json(indent=1))
    out = run_dir / "result.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(spec.num_devices),
        "-m",
        "runner",
        "--spec",
        str(run_dir / "spec.json"),
        "--out",
        str(out),
    ]
    log.info(
        "start %s/%s/N=%d (timeout %.0f s): %s", spec.precision, spec.layout, spec.num_devices, timeout_s, " ".join(cmd)
    )
    t0 = time.monotonic()
    with (run_dir / "log.txt").open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=launch_env(spec, os.cpu_count() or 1),
            cwd=str(run_dir),
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGTERM)  # our own process group: torchrun and its ranks
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    wall_s = time.monotonic() - t0
    tail = (run_dir / "log.txt").read_bytes()[-4000:].decode(errors="replace")
    if code is None:
        return failed(spec, "timeout", f"past the per-run budget of {timeout_s:.0f} s"), wall_s, tail
    if out.exists():
        try:
            return RunResult.model_validate_json(out.read_text()), wall_s, tail
        except ValueError as exc:
            return failed(spec, "result_missing", f"result.json does not validate: {exc}"), wall_s, tail
    return failed(spec, "result_missing", f"torchrun exited {code} without result.json"), wall_s, tail


# ---------------------------------------------------------------------------------------- outputs


def run_point(i: int, spec: RunSpec, res: RunResult) -> RunPoint:
    s, n = res.summary, res.numerics
    return RunPoint(
        run_id=i,
        model=spec.model,
        num_layers=spec.num_layers,
        precision=spec.precision,
        layout=spec.layout,
        scaling=spec.scaling,
        cluster=spec.cluster,
        num_devices=spec.num_devices,
        status=res.status,
        tokens_per_sec=s.tokens_per_sec if s else None,
        step_ms_median=s.step_ms_median if s else None,
        mfu_vs_bf16_peak=s.mfu_vs_bf16_peak if s else None,
        mfu_vs_precision_peak=s.mfu_vs_precision_peak if s else None,
        peak_memory_allocated_gib=s.peak_memory_allocated_gib if s else None,
        final_loss=n.final_loss if n else None,
    )


def import_body(exp: ExperimentSpec, cluster: Cluster, done: dict, members: list, i: int) -> dict | None:
    """POST /experiments/import body for experiment i: its succeeded points (api/routers/imports.py)."""
    points = []
    for j, spec in members:
        res = done.get((spec.run_key(), spec.repeat))
        if j != i or res is None or res.status != "succeeded":
            continue
        s, env = res.summary, res.environment
        points.append(
            {
                "num_devices": spec.num_devices,
                "precision": spec.precision,
                "layout": spec.layout,
                "tokens_per_sec": s.tokens_per_sec,
                "step_ms": s.step_ms_median,
                "peak_memory_gib": s.peak_memory_allocated_gib,
                "final_loss": res.numerics.final_loss,
                "loss_curve": res.numerics.loss_curve,
                "repeat": spec.repeat,
                "environment": env.model_dump(mode="json") if env else {},
            }
        )
    if not points:
        return None
    device = points[0]["environment"].get("device_name") or cluster.device_name
    return {
        "name": exp.name,
        "model": exp.model,
        "num_layers": exp.num_layers,
        "cluster": cluster.name,
        "vendor": cluster.vendor,
        "device_name": device,
        "scaling": exp.scaling,
        "seq_len": exp.seq_len,
        "local_batch_size": exp.local_batch_size,
        "compile": exp.compile,
        "activation_checkpointing": exp.activation_checkpointing,
        "fp8_all_gather": exp.fp8_all_gather,
        "tags": exp.tags,
        "points": points,
    }


def fmt(x, spec="{:.0f}") -> str:
    return "-" if x is None else spec.format(x)


def table(report: ScalingReport, results: list[dict], not_run: list[str], impossible: list[str], head: str) -> str:
    by = {(r["spec"]["precision"], r["spec"]["layout"], r["spec"]["degrees"]["world_size"]): r for r in results}
    lines = [
        head,
        f"{'precision':<15} {'layout':<10} {'N':>2} {'status':<9} {'X tok/s':>8} {'tok/s/GPU':>9} "
        f"{'E(N)':>6} {'S(N)':>6} {'MFU bf16':>8} {'MFU own':>7} {'mem GiB':>7} {'step ms':>7} "
        f"{'wall s':>6} {'loss':>6}",
    ]
    for s in report.series:
        for p in s.points:
            r = by.get((s.key.precision, s.key.layout, p.num_devices), {})
            lines.append(
                f"{s.key.precision:<15} {s.key.layout:<10} {p.num_devices:>2} {p.status:<9} "
                f"{fmt(p.tokens_per_sec):>8} {fmt(p.tokens_per_sec_per_device):>9} "
                f"{fmt(p.efficiency, '{:.1%}'):>6} {fmt(p.fp8_speedup, '{:.3f}'):>6} "
                f"{fmt(p.mfu_vs_bf16_peak, '{:.1%}'):>8} {fmt(p.mfu_vs_precision_peak, '{:.1%}'):>7} "
                f"{fmt(p.peak_memory_allocated_gib, '{:.1f}'):>7} {fmt(p.step_ms_median, '{:.0f}'):>7} "
                f"{fmt(r.get('wall_s')):>6} {fmt(p.final_loss, '{:.3f}'):>6}"
            )
    for r in results:
        if r["result"]["status"] != "succeeded":
            e = r["result"]["error"]
            lines.append(f"FAILED {r['label']}: {e['kind']}: {e['message'].splitlines()[0][:300]}")
    lines += [f"not run: {x}" for x in not_run] + [f"not a point: {x}" for x in impossible]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ sweep


def sweep(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.smoke:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/scalebench-inductor")  # shared by every run
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation
    import torch  # only to count devices; the runs are separate processes

    num_devices = args.num_devices or (2 if args.smoke else torch.cuda.device_count())
    cluster, exps, fallback = load_config(Path(args.config), smoke=args.smoke, num_devices=num_devices)
    order, members, not_run, impossible = plan(cluster, exps, num_devices)
    log.info(
        "%d devices; %d runs to make, %d not run, %d not points", num_devices, len(order), len(not_run), len(impossible)
    )
    done: dict[tuple[str, int], RunResult] = {}
    results: list[dict] = []
    runs_dir = Path(args.runs_dir)
    k = 0
    while k < len(order):
        spec = order[k]
        label = f"{spec.precision}/{spec.layout}/N={spec.num_devices}/L{spec.num_layers}"
        left_s = args.budget_s - (time.monotonic() - t_start) - REPORT_RESERVE_S
        if left_s < args.min_run_s:
            not_run.append(f"{label}: overall budget (--budget-s {args.budget_s:.0f}) spent")
            k += 1
            continue
        res, wall_s, tail = run_one(spec, runs_dir / f"{k:02d}", min(args.run_timeout_s, left_s))
        log.info(
            "%s: %s in %.0f s%s",
            label,
            res.status,
            wall_s,
            f" ({res.error.kind}: {res.error.message.splitlines()[0][:200]})"
            if res.error
            else f" ({res.summary.tokens_per_sec:.0f} tok/s, {res.summary.peak_memory_allocated_gib} GiB)",
        )
        results.append(
            {
                "label": label,
                "wall_s": wall_s,
                "spec": spec.model_dump(mode="json"),
                "result": res.model_dump(mode="json"),
                "log_tail": None if res.status == "succeeded" else tail,
            }
        )
        if k == 0 and res.error and res.error.kind == "oom" and fallback:
            log.warning("%s ran out of memory: restarting the sweep at num_layers=%d", label, fallback)
            exps = [e.model_copy(update={"num_layers": fallback}) for e in exps]
            order, members, not_run, impossible = plan(cluster, exps, num_devices)
            not_run.insert(0, f"{label}: out of memory; sweep restarted with num_layers={fallback}")
            fallback, k = None, 0
            continue
        done[(spec.run_key(), spec.repeat)] = res
        k += 1
    return finish(out, cluster, exps, members, done, results, not_run, impossible, t_start)


def finish(out, cluster, exps, members, done, results, not_run, impossible, t_start) -> int:
    from api.plots import render_scaling_png  # matplotlib: imported after the runs

    # A run at the depth given up on (out of memory, then the fallback) is in results.json, not in the report.
    points = [
        run_point(i, RunSpec.model_validate(r["spec"]), RunResult.model_validate(r["result"]))
        for i, r in enumerate(results)
        if r["spec"]["num_layers"] == exps[0].num_layers
    ]
    report = build_report(points)
    env = next((r["result"]["environment"] for r in results if r["result"].get("environment")), {}) or {}
    head = (
        f"== scaling sweep: {env.get('device_name', cluster.device_name)} x{cluster.gpus_per_node}, "
        f"{exps[0].model}/L{exps[0].num_layers}, seq {exps[0].seq_len} x local batch {exps[0].local_batch_size}, "
        f"compile {exps[0].compile}, torch {env.get('torch_version')}, torchao {env.get('torchao_version')}, "
        f"NCCL {env.get('nccl_version')}, {time.monotonic() - t_start:.0f} s =="
    )
    (out / "results.json").write_text(
        json.dumps(
            {"cluster": cluster.model_dump(), "runs": results, "not_run": not_run, "not_points": impossible}, indent=1
        )
    )
    (out / "report.json").write_text(report.model_dump_json(indent=1))
    if report.series:
        (out / "scaling.png").write_bytes(render_scaling_png(report, title=head.strip("= ")))
    for i, exp in enumerate(exps):
        body = import_body(exp, cluster, done, members, i)
        if body:
            (out / f"import-{i}.json").write_text(json.dumps(body))
    text = table(report, results, not_run, impossible, head)
    (out / "table.txt").write_text(text + "\n")
    print(text, flush=True)
    return 0 if results and all(r["result"]["status"] == "succeeded" for r in results) else 1


# ----------------------------------------------------------------------------------------- record


def record(src: Path, png: Path | None, data_dir: Path) -> int:
    """Import src/import-*.json through POST /experiments/import on a fresh SQLite store; save the API's PNGs."""
    import shutil

    from alembic import command
    from alembic.config import Config
    from fastapi.testclient import TestClient

    from api.app import create_app
    from core.settings import Settings
    from db.session import make_engine, make_session_factory, session_scope
    from db.tokens import create_token

    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    settings = Settings(
        data_dir=data_dir,
        database_url=f"sqlite:///{data_dir / 'scalebench.db'}",
        broker_url=f"filesystem://{data_dir / 'broker'}",
        runs_dir=data_dir / "runs",
    )
    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes.update(url=settings.database_url, configure_logger=False)
    command.upgrade(cfg, "head")
    engine = make_engine(settings.database_url)
    with session_scope(make_session_factory(engine)) as session:
        token, _ = create_token(session, "scaling-sweep")
    engine.dispose()
    bodies = sorted(src.glob("import-*.json"))
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as c:
        for i, path in enumerate(bodies):
            r = c.post("/experiments/import", json=json.loads(path.read_text()))
            assert r.status_code == 201, f"{path.name}: {r.status_code} {r.text[:2000]}"
            exp_id = r.json()["id"]
            rep = ScalingReport.model_validate(c.get(f"/experiments/{exp_id}/scaling").json())
            print(
                table(
                    rep,
                    [],
                    [],
                    [],
                    f"== API: experiment {exp_id} ({r.json()['name']}), {len(r.json()['runs'])} "
                    f"runs imported, {r.headers['Location']} ==",
                )
            )
            img = c.get(f"/experiments/{exp_id}/scaling.png")
            assert img.status_code == 200 and img.headers["content-type"] == "image/png", img.text[:500]
            target = (png if i == 0 else png.with_name(f"{png.stem}-{i}{png.suffix}")) if png else src / f"api-{i}.png"
            target.write_bytes(img.content)
            print(f"saved {target} ({len(img.content)} bytes)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "examples/h200-scaling.yaml"))
    ap.add_argument("--out", default=os.environ.get("OUT", "sweep-out"))
    ap.add_argument("--runs-dir", default="/tmp/scalebench-sweep-runs", help="per-run spec/result/log directories")
    ap.add_argument("--smoke", action="store_true", help="CPU: debug shape, gloo, 4 steps, 2 'devices'")
    ap.add_argument("--num-devices", type=int, default=None, help="devices present (default: torch's count)")
    ap.add_argument("--budget-s", type=float, default=520.0, help="no run starts that could end after this")
    ap.add_argument("--run-timeout-s", type=float, default=200.0, help="per-run wall-clock limit")
    ap.add_argument("--min-run-s", type=float, default=60.0, help="skip a run with less budget than this left")
    ap.add_argument("--record", type=Path, default=None, help="import DIR/import-*.json via the API instead")
    ap.add_argument("--png", type=Path, default=None, help="--record: where to save the API's PNG")
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/scalebench-sweep-record"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if args.record:
        return record(args.record, args.png, args.data_dir)
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
