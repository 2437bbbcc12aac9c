"""Scaling-analysis load benchmark (a script, not a test): uvicorn + PostgreSQL on this machine.

Seeds one experiment of --runs runs (2,000: 4 precisions x 5 layouts x 10 GPU counts x 10 repeats; 20,000:
the same matrix with 100 repeats, a history of re-runs; ~1% failed) with their summaries, stored loss
curves and 100 step records per run (200,000 or 2,000,000; COPY). The last --record runs are left
running. Then it measures:

1. GET /experiments/{id}/scaling, one request at a time: p50/p99, cold (each request names another
   full_size, so no answer comes from the answer cache: load + report + JSON; the fits of unchanged
   series come from the per-series fit cache) and warm (the per-process answer cache keyed by ETag).
2. The same at concurrency 100, cold and warm (req/s when every dashboard asks at once).
3. ETag polling at concurrency 100: GET /experiments/{id}/scaling with If-None-Match (all 304): req/s, p50/p99.
4. The same for GET /experiments/{id} (what the dashboard polls first), and GET /healthz (the floor).
5. Phases 3-4 again with a minimal asyncio HTTP/1.1 client (httpx costs ~2.5 ms CPU per request, more
   than the server's ~1 ms for a 304, and it shares the same two cores).
6. The --record running runs finished one by one with db.runs.record_result (100 steps each; the timed
   span includes the commit), each followed by a cold GET /scaling: the rebuild after a run finished,
   which refits the one series whose X(N) moved.
Every phase also prints CPU ms per request of uvicorn, its PostgreSQL backends and the client (the
machine is shared: CPU per request is the load-independent number).
Targets: 2,000 runs: cold p50 <= 50 ms; 20,000 runs: cold p50 <= 200 ms, warm p50 <= 20 ms, 304 polls
>= 1,000 req/s (raw client), record_result p50 < 50 ms.

    python bench/scaling_load.py [--runs 2000|20000] [--workers 2] [--duration-s 10] [--sequential 60]

It creates (drops first) the database scalebench_bench_scaling.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import free_port, fresh_database, start_uvicorn, versions  # noqa: E402
from core.contracts.clusters import Cluster  # noqa: E402
from core.contracts.matrix import expand  # noqa: E402
from core.contracts.specs import ExperimentSpec, RunResult, RunSpec  # noqa: E402
from db.experiments import create_experiment  # noqa: E402
from db.models import Run, RunLossCurve, RunSummary  # noqa: E402
from db.points import loss_curve_row  # noqa: E402
from db.runs import claim_run, record_result  # noqa: E402
from db.session import make_engine, make_session_factory, session_scope  # noqa: E402

log = logging.getLogger("scaling_load")
BENCH_DB = "scalebench_bench_scaling"
REDIS_URL = "redis://127.0.0.1:6379/12"  # the app's Celery client connects lazily; nothing is published
CLUSTER = Cluster(
    name="h200-big",
    vendor="nvidia",
    device_name="NVIDIA H200",
    gpus_per_node=8,
    max_nodes=512,
    launcher="slurm",
    queue="h200-big",
)
CLUSTERS_TOML = """[[cluster]]
name = "h200-big"
vendor = "nvidia"
device_name = "NVIDIA H200"
gpus_per_node = 8
max_nodes = 512
launcher = "slurm"
queue = "h200-big"
"""
SPEC = ExperimentSpec(
    name="bench 8b scaling, 2000 runs",
    model="8b",
    cluster="h200-big",
    gpu_counts=[8 * 2**i for i in range(10)],  # 8 .. 4096
    precisions=["bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp"],
    layouts=["fsdp", "ddp", "hsdp:shard=8", "tp=2+fsdp", "tp=4+fsdp"],
    repeats=10,
    seq_len=8192,
    steps=100,
    warmup_steps=5,
)
STEPS_PER_RUN = 100
SPEEDUP = {"bf16": 1.0, "fp8-tensorwise": 1.16, "fp8-rowwise": 1.03, "fp8-rowwise-gw-hp": 1.10}


def _runs(num_runs: int) -> list[RunSpec]:
    """The matrix (200 points) with num_runs / 200 repeats: spec repeats up to 20, then the matrix again
    with the next repeat numbers (an experiment whose history of re-runs accumulates)."""
    assert num_runs % 200 == 0, "--runs: a multiple of 200 (the matrix has 200 points)"
    repeats = num_runs // 200
    base, _ = expand(SPEC.model_copy(update={"repeats": min(repeats, 20)}), CLUSTER)
    block = min(repeats, 20)
    runs = [r.model_copy(update={"repeat": r.repeat + block * k}) for k in range(repeats // block) for r in base]
    assert len(runs) == num_runs and repeats % block == 0, (len(runs), num_runs)
    return runs


def _values(rng: random.Random, r: RunSpec) -> tuple[float, float, float]:
    """(tokens/s per device, global tokens/s, final loss) of one seeded run."""
    per_device = 17_600 * SPEEDUP[r.precision] * (0.97 ** (r.num_devices.bit_length() - 4)) * rng.uniform(0.98, 1.02)
    return per_device, per_device * r.num_devices, 3.0 + rng.uniform(-0.02, 0.02)


def _losses(final: float) -> list[float]:
    return [10.0 * (0.97**step) + final for step in range(STEPS_PER_RUN)]


def _summary(r: RunSpec, per_device: float, tps: float) -> dict:
    step_ms = r.tokens_per_step / tps * 1000
    return dict(
        num_timed_steps=95,
        tokens_per_step=r.tokens_per_step,
        tokens_per_sec=tps,
        tokens_per_sec_per_device=per_device,
        step_ms_median=step_ms,
        step_ms_min=step_ms * 0.99,
        step_ms_max=step_ms * 1.01,
        flops_per_token=10**10,
        tflops_per_device=400.0,
        mfu_vs_bf16_peak=0.4,
        peak_memory_allocated_gib=60.0,
    )


def seed(url: str, num_runs: int, num_running: int) -> tuple[int, list[tuple[int, RunSpec]]]:
    """The experiment, its runs ended (summaries, result JSON, stored loss curves) and their step records,
    but the last num_running, left running; its id and those (run id, RunSpec)."""
    rng = random.Random(0)
    runs = _runs(num_runs)
    engine = make_engine(url)
    t0 = time.perf_counter()
    with session_scope(make_session_factory(engine)) as s:
        spec = SPEC.model_copy(update={"name": f"bench 8b scaling, {num_runs} runs"})
        exp, run_ids = create_experiment(s, spec, runs, CLUSTER.queue_name)
        updates, summaries, curves, copy_rows = [], [], [], io.StringIO()
        ended = list(zip(run_ids, runs))[: num_runs - num_running]
        for run_id, r in ended:
            failed = rng.random() < 0.01
            per_device, tps, final = _values(rng, r)
            updates.append(
                {
                    "id": run_id,
                    "status": "failed" if failed else "succeeded",
                    "error_kind": "oom" if failed else None,
                    "error_message": "CUDA out of memory" if failed else None,
                    "result": None if failed else {"numerics": {"final_loss": final}},
                }
            )
            if not failed:
                summaries.append(dict(run_id=run_id, final_loss=final, **_summary(r, per_device, tps)))
            losses = _losses(final)
            curves.append(loss_curve_row(run_id, list(enumerate(losses))))
            for step, loss in enumerate(losses):
                copy_rows.write(f"{run_id}\t{step}\t{loss}\t{100.0}\t{r.tokens_per_step}\t{'t' if step < 5 else 'f'}\n")
        now = sa.func.now()
        s.execute(sa.update(Run), updates)
        s.execute(sa.update(Run).where(Run.id.in_([i for i, _ in ended])).values(started_at=now, finished_at=now))
        s.execute(sa.insert(RunSummary), summaries)
        s.execute(sa.insert(RunLossCurve), curves)
        raw = s.connection().connection.dbapi_connection
        with (
            raw.cursor() as cur,
            cur.copy("COPY step_metrics (run_id, step, loss, step_ms, tokens, warmup) FROM STDIN") as cp,
        ):
            cp.write(copy_rows.getvalue())
        running = list(zip(run_ids, runs))[num_runs - num_running :]
        for run_id, _ in running:
            assert claim_run(s, run_id, "bench", "bench", 3600)
        exp_id = exp.id
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))  # what autovacuum does soon after a bulk load
        counts = conn.execute(sa.text("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM step_metrics)")).one()
    engine.dispose()
    print(
        f"seeded experiment {exp_id}: {counts[0]} runs ({num_running} left running), {counts[1]} step records "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return exp_id, running


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _pg_backends(url: str) -> list[int]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        pids = list(
            conn.execute(
                sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
                {"d": BENCH_DB},
            ).scalars()
        )
    engine.dispose()
    return pids


class CpuMeter:
    """CPU seconds used by the uvicorn processes, their PostgreSQL backends and this client between two marks."""

    def __init__(self, server_pid: int, url: str):
        self.server_pid, self.url = server_pid, url

    def mark(self) -> dict[str, float]:
        server = [self.server_pid, *_children(self.server_pid)]
        return {
            "server": sum(_cpu_s(p) for p in server),
            "postgres": sum(_cpu_s(p) for p in _pg_backends(self.url)),
            "client": time.process_time(),
        }


METER: CpuMeter | None = None


def stats(name: str, latencies_s: list[float], wall_s: float, errors: int) -> dict:
    ms = sorted(x * 1000 for x in latencies_s)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    row = {
        "phase": name,
        "requests": len(ms),
        "errors": errors,
        "req_per_s": len(ms) / wall_s,
        "p50_ms": q[49],
        "p99_ms": q[98],
        "max_ms": ms[-1],
    }
    print(
        f"{name:<52} {row['requests']:>6} req {errors:>3} err {row['req_per_s']:>8.1f} req/s "
        f"p50 {row['p50_ms']:>7.1f} ms  p99 {row['p99_ms']:>7.1f} ms  max {row['max_ms']:>7.1f} ms",
        flush=True,
    )
    return row


def cpu_line(before: dict[str, float], after: dict[str, float], num_requests: int) -> None:
    # max(0, ..): PostgreSQL backends that exit between the marks take their CPU with them
    per = {k: max(0.0, 1000 * (after[k] - before[k]) / max(num_requests, 1)) for k in before}
    service = per["server"] + per["postgres"]
    print(
        f"{'':<52} CPU per request: server {per['server']:.2f} ms + postgres {per['postgres']:.2f} ms "
        f"(client {per['client']:.2f} ms) -> 2 idle cores serve ~{2000 / service:.0f} req/s "
        f"(~{2000 / (service + per['client']):.0f} with this client on the same cores)",
        flush=True,
    )


async def sequential(base: str, path: str, count: int, cold: bool) -> dict:
    """cold: every request names another full_size, so no answer comes from the per-process cache."""
    latencies, errors = [], 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for i in range(3):
            await client.get(f"{path}?full_size={100_000 + i}")  # warm-up: imports, pool, plans
        before = METER.mark() if METER else None
        t0 = time.perf_counter()
        for i in range(count):
            t = time.perf_counter()
            r = await client.get(f"{path}?full_size={5000 + i}" if cold else path)
            latencies.append(time.perf_counter() - t)
            errors += r.status_code != 200 or len(r.content) < 1000
        wall = time.perf_counter() - t0
    after = METER.mark() if METER else None
    row = stats(f"GET {path} sequential, {'cold (rebuilt)' if cold else 'warm (cached)'}", latencies, wall, errors)
    if before and after:
        cpu_line(before, after, count)
    return row


async def concurrent(
    base: str, path: str, concurrency: int, duration_s: float, conditional: bool, cold: bool = False
) -> dict:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        first = await client.get(path)
        headers = {"If-None-Match": first.headers["etag"]} if conditional else {}
        expect = 304 if conditional else 200

        counter = iter(range(10**9))

        async def worker(stop: float) -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t = time.perf_counter()
                url = f"{path}?full_size={10_000 + next(counter)}" if cold else path
                try:
                    r = await client.get(url, headers=headers)
                except httpx.HTTPError as exc:  # counted, and the first few shown
                    errors += 1
                    if errors <= 3:
                        print(f"  {type(exc).__name__}: {exc!r}", flush=True)
                    continue
                latencies.append(time.perf_counter() - t)
                errors += r.status_code != expect

        await asyncio.gather(*(client.get(path, headers=headers) for _ in range(concurrency)))  # open connections
        before = METER.mark() if METER else None
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(t0 + duration_s) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        after = METER.mark() if METER else None
    kind = "If-None-Match (304)" if conditional else ("200, cold (rebuilt)" if cold else "200, warm (cached)")
    label = f"GET {path} {kind} x{concurrency}"
    row = stats(label, latencies, wall, errors)
    if before and after:
        cpu_line(before, after, len(latencies))
    return row


async def raw_conditional(base: str, path: str, concurrency: int, duration_s: float) -> dict:
    """The 304 poll with a minimal asyncio HTTP/1.1 keep-alive client (no httpx): what the server sustains
    when the load generator costs little CPU (httpx spends ~2.5 ms of CPU per request here)."""
    host, port = base.removeprefix("http://").split(":")
    etag = httpx.get(base + path, timeout=60).headers["etag"]
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nIf-None-Match: {etag}\r\n\r\n").encode()
    latencies: list[float] = []
    errors = 0

    async def worker(stop: float) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.perf_counter() < stop:
            t = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - t)
            errors += not head.startswith(b"HTTP/1.1 304")
        writer.close()

    before = METER.mark() if METER else None
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(t0 + duration_s) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    after = METER.mark() if METER else None
    row = stats(f"GET {path} If-None-Match (304) x{concurrency}, raw client", latencies, wall, errors)
    if before and after:
        cpu_line(before, after, len(latencies))
    return row


def record_then_read(url: str, base: str, path: str, running: list[tuple[int, RunSpec]]) -> tuple[dict, dict]:
    """Finish each running run with record_result (100 steps, summary, commit), then GET the report with a
    new full_size: the write a worker makes and the cold rebuild every poller gets after it."""
    rng = random.Random(1)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    record_s, read_s, errors = [], [], 0
    before = METER.mark() if METER else None
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=60) as client:
        for i, (run_id, r) in enumerate(running):
            per_device, tps, final = _values(rng, r)
            steps = [
                {"step": st, "loss": loss, "step_ms": 100.0, "tokens": r.tokens_per_step, "warmup": st < 5}
                for st, loss in enumerate(_losses(final))
            ]
            result = RunResult.model_validate(
                {
                    "run_key": r.run_key(),
                    "status": "succeeded",
                    "steps": steps,
                    "summary": _summary(r, per_device, tps),
                    "numerics": {"final_loss": final},
                }
            )
            t = time.perf_counter()
            with session_scope(factory) as s:
                ok = record_result(s, run_id, result)
            record_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            resp = client.get(f"{path}?full_size={20_000 + i}")
            read_s.append(time.perf_counter() - t)
            errors += (not ok) + (resp.status_code != 200)
    wall = time.perf_counter() - t0
    after = METER.mark() if METER else None
    engine.dispose()
    rec = stats("record_result (100 steps, summary, curve; commit)", record_s, wall, errors)
    row = stats(f"GET {path} cold, right after each record_result", read_s, wall, errors)
    if before and after:
        cpu_line(before, after, len(running))
    return rec, row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--sequential", type=int, default=60, help="requests of the sequential phase")
    parser.add_argument("--runs", type=int, default=2000, help="runs in the experiment (a multiple of 200)")
    parser.add_argument("--record", type=int, default=50, help="runs left running, then recorded one by one")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    url = fresh_database(BENCH_DB)
    exp_id, running = seed(url, args.runs, args.record)
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(CLUSTERS_TOML)
    os.environ["SCALEBENCH_DATA_DIR"] = tempfile.mkdtemp(prefix="scaling-load-")
    proc = start_uvicorn(url, REDIS_URL, f.name, port, args.workers)
    base = f"http://127.0.0.1:{port}"
    scaling = f"/experiments/{exp_id}/scaling"
    global METER
    METER = CpuMeter(proc.pid, url)
    try:
        print(
            f"{platform.machine()}: {os.cpu_count()} cores, load avg {os.getloadavg()}; {versions()}; "
            f"uvicorn workers {args.workers}"
        )
        size = len(httpx.get(base + scaling, timeout=60).content)
        print(f"scaling report: {size / 1024:.0f} KiB JSON")
        asyncio.run(sequential(base, scaling, args.sequential, cold=True))
        asyncio.run(sequential(base, scaling, args.sequential, cold=False))
        asyncio.run(concurrent(base, scaling, args.concurrency, args.duration_s, conditional=False, cold=True))
        asyncio.run(concurrent(base, scaling, args.concurrency, args.duration_s, conditional=False))
        asyncio.run(concurrent(base, scaling, args.concurrency, args.duration_s, conditional=True))
        asyncio.run(concurrent(base, f"/experiments/{exp_id}", args.concurrency, args.duration_s, conditional=True))
        asyncio.run(concurrent(base, "/healthz", args.concurrency, args.duration_s, conditional=False))  # the floor
        asyncio.run(raw_conditional(base, scaling, args.concurrency, args.duration_s))
        asyncio.run(raw_conditional(base, f"/experiments/{exp_id}", args.concurrency, args.duration_s))
        record_then_read(url, base, scaling, running)
        print(f"load avg at the end: {os.getloadavg()}")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
