"""POST /experiments/import and /experiments/import/logs: runs made elsewhere (a published table, another
trainer's logs) get the same curves and verdicts. The points pass the same validation as a submitted experiment:
the matrix they span is expanded by core.contracts.matrix.expand on the cluster, and a point the expansion skips
is refused with the skip reason (the engine rules are left out: an imported run already ran). A log is read by
the parsers the command engine uses (core.engines.logs.read_log) into such a point.

Every value stored is finite and storable text, and so is every value derived from it (per-device
throughput, step time, TFLOP/s, MFU, the ideal throughput of E(N)): an input whose derived value would
overflow or underflow (tokens_per_sec 1e308 or 5e-324) is refused with a 422 naming the input. The rows
are written in bounded transactions (db.imports), so a large import never holds SQLite's write lock long.
Imported loss curves go to the loss-curve table like a measured run's (db.points.loss_curve_row), so the fp8
loss verdict of /scaling reads them.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

import db.experiments
from api.deps import ClustersDep, SessionDep, WriteAuth
from api.guard import GuardedRoute
from api.problems import WRITE_RESPONSES, FieldError, ProblemError, validation_errors
from api.schemas.experiments import experiment_read, run_briefs
from api.schemas.imports import (
    MAX_CURVE_POINTS,
    MAX_STEP,
    MAX_TOTAL_CURVE_POINTS,
    ExperimentImport,
    ImportHead,
    ImportLog,
    ImportPoint,
    ImportRead,
    LogsImport,
)
from core.catalog.hardware import peak_tflops
from core.catalog.shapes import get_shape
from core.contracts.clusters import Cluster
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import (
    DEFAULT_ENGINE,
    Environment,
    EvalPoint,
    ExperimentSpec,
    Numerics,
    RunResult,
    RunSpec,
    Summary,
    bad_values,
    resolve_layout,
)
from core.engines.logs import DEFAULT_LOG_ENGINES, read_log
from db.imports import (
    ImportedSteps,
    curve_chunks,
    finish_imported,
    insert_loss_curves,
    insert_steps,
    pause_for_other_writers,
    record_imported,
    result_chunks,
    step_chunks,
    store_results,
)

__all__ = ["ExperimentImport", "ImportPoint", "LogsImport", "router"]  # the schemas live in api.schemas.imports

router = APIRouter(prefix="/experiments", tags=["experiments"], route_class=GuardedRoute)
UNKNOWN_TORCH = "unknown (imported)"


# ------------------------------------------------------------------------------------------- building


def _bad(errors: list[FieldError], detail: str = "invalid import") -> ProblemError:
    return ProblemError(422, f"{detail}: " + "; ".join(f"{e.field}: {e.message}" for e in errors[:5]), errors)


def _cluster(body: ImportHead, clusters: dict[str, Cluster], max_num_devices: int) -> Cluster:
    """The configured cluster, or one described by the body (sized to the largest N imported). A vendor that
    contradicts the configured cluster's is a 422, not dropped (a device name may be more exact than the
    cluster's, e.g. the one the runs' environment recorded, so it is not compared)."""
    if body.cluster in clusters:
        cluster = clusters[body.cluster]
        if body.vendor is not None and body.vendor != cluster.vendor:
            message = (
                f"{body.vendor!r}, but the configured cluster {cluster.name!r} is {cluster.vendor!r} (leave vendor "
                "out, or name a cluster that is not configured to describe a new one)"
            )
            raise _bad([FieldError(field="vendor", message=message, allowed=[cluster.vendor])])
        return cluster
    missing = [f for f in ("vendor", "device_name") if getattr(body, f) is None]
    if missing:
        raise _bad(
            [
                FieldError(
                    field=f,
                    message=f"required when cluster {body.cluster!r} is not configured "
                    f"(configured: {', '.join(sorted(clusters))})",
                )
                for f in missing
            ]
        )
    assert body.vendor is not None and body.device_name is not None  # checked just above
    try:
        return Cluster(
            name=body.cluster,
            vendor=body.vendor,
            device_name=body.device_name,
            gpus_per_node=1,
            max_nodes=max_num_devices,
            launcher="local",
            queue="import",
        )
    except ValidationError as exc:
        raise _bad([FieldError(field="cluster", message=e["msg"]) for e in exc.errors()]) from exc


def _spec(body: ImportHead, pts: list[ImportPoint], engines: list[str] | None = None) -> ExperimentSpec:
    """The experiment's spec. engines None: the points' own (stored); the matrix is expanded with the default
    engine only, since an imported run is not checked against what the cluster offers (it already ran)."""
    seeds = sorted({p.seed for p in pts})
    try:
        return ExperimentSpec(
            name=body.name,
            model=body.model,
            num_layers=body.num_layers,
            cluster=body.cluster,
            gpu_counts=sorted({p.num_devices for p in pts}),
            precisions=list(dict.fromkeys(p.precision for p in pts)),
            layouts=list(dict.fromkeys(p.layout for p in pts)),
            engines=engines if engines is not None else list(dict.fromkeys(p.engine for p in pts)),
            scaling=body.scaling,
            seq_len=body.seq_len,
            local_batch_size=body.local_batch_size,
            global_batch_size=body.global_batch_size,
            steps=max(p.num_steps() for p in pts),
            warmup_steps=0,
            repeats=max(p.repeat for p in pts) + 1,
            seeds=seeds if seeds != [0] else None,
            compile=body.compile,
            activation_checkpointing=body.activation_checkpointing,
            fp8_all_gather=body.fp8_all_gather,
            stacks=body.stacks if engines is None else {},  # keyed by the points' engines
            tags=list(dict.fromkeys([*body.tags, "imported"])),
        )
    except ValidationError as exc:
        raise _bad(validation_errors(list(exc.errors()))) from exc


def _check_sizes(pts: list[ImportPoint], field: str = "points") -> None:
    """The limits that span points: distinct engines and seeds (an experiment's axes), loss values in all."""
    errors = []
    if sum(len(p.loss_curve) + len(p.eval_curve) for p in pts) > MAX_TOTAL_CURVE_POINTS:
        errors.append(FieldError(field=field, message=f"more than {MAX_TOTAL_CURVE_POINTS} loss-curve points in all"))
    for name, limit in (("engine", 8), ("seed", 16)):
        if len({getattr(p, name) for p in pts}) > limit:
            errors.append(FieldError(field=field, message=f"more than {limit} distinct {name}s in one experiment"))
    if errors:
        raise _bad(errors)


def _match_points(pts: list[ImportPoint], cluster: Cluster, spec: ExperimentSpec, field: str) -> list[RunSpec]:
    """The expanded RunSpec of every point, in order (with the point's engine); 422 naming each point the
    matrix refuses or repeats."""
    try:
        runs, skipped = expand(spec, cluster)
    except MatrixError as exc:
        runs, skipped = [], exc.skipped
    by_point = {(r.precision, r.layout, r.num_devices, r.seed, r.repeat): r for r in runs}
    why = {(s.precision, s.layout, s.num_devices): s.reason for s in skipped}
    errors: list[FieldError] = []
    seen: dict[tuple[str, str, str, int, int, int], int] = {}
    out: list[RunSpec | None] = []
    for i, p in enumerate(pts):
        key = (p.engine, p.precision, p.layout, p.num_devices, p.seed, p.repeat)
        if key in seen:
            errors.append(
                FieldError(
                    field=f"{field}[{i}]",
                    message=f"same engine, precision, layout, num_devices, seed and repeat as {field}[{seen[key]}]",
                )
            )
        elif key[1:] not in by_point:
            errors.append(FieldError(field=f"{field}[{i}]", message=why.get(key[1:4], "not a point of the matrix")))
        seen.setdefault(key, i)
        run = by_point.get(key[1:])
        out.append(run.model_copy(update={"engine": p.engine}) if run is not None else None)
    if errors:
        raise _bad(errors, "points the matrix refuses")
    return [r for r in out if r is not None]  # no errors: every point was found


def _environment(field: str, p: ImportPoint | ImportLog, cluster: Cluster) -> Environment:
    if bad := bad_values(p.environment):
        raise _bad([FieldError(field=f"{field}.environment.{path}", message=why) for path, why in bad])
    unknown = sorted(set(p.environment) - set(Environment.model_fields))
    if unknown:
        raise _bad(
            [
                FieldError(
                    field=f"{field}.environment.{k}",
                    message="unknown environment field",
                    allowed=sorted(Environment.model_fields),
                )
                for k in unknown
            ]
        )
    world = p.environment.get("world_size")
    if world is not None and world != p.num_devices:
        raise _bad(
            [
                FieldError(
                    field=f"{field}.environment.world_size",
                    message=f"{world!r}, but the point is measured on num_devices {p.num_devices}: the ranks of "
                    "one run are its devices (leave world_size out: it defaults to num_devices)",
                    allowed=[p.num_devices],
                )
            ]
        )
    defaults = {
        "vendor": cluster.vendor,
        "device_name": cluster.device_name,
        "device_count": p.num_devices,
        "world_size": p.num_devices,
        "torch_version": UNKNOWN_TORCH,
        "engine": p.engine,
    }
    try:
        return Environment.model_validate(defaults | p.environment)
    except ValidationError as exc:
        raise _bad(
            [
                FieldError(field=f"{field}.environment.{'.'.join(map(str, e['loc']))}", message=e["msg"])
                for e in exc.errors()
            ]
        ) from exc


def _summary(p: ImportPoint, run: RunSpec, env: Environment, timing: dict[str, Any]) -> Summary:
    n = p.num_devices
    tps = p.global_tokens_per_sec()
    step_ms = p.step_ms or run.tokens_per_step / tps * 1000.0
    flops_per_token = get_shape(run.model, run.num_layers).flops_per_token(run.seq_len)
    tflops = flops_per_token * tps / n / 1e12
    bf16_peak, own_peak = peak_tflops(env.device_name, p.precision, env.gcn_arch)
    note = None if bf16_peak else f"no MFU: device {env.device_name!r} is not in the peak table (core.catalog.hardware)"
    return Summary(
        num_timed_steps=0,
        tokens_per_step=run.tokens_per_step,
        tokens_per_sec=tps,
        tokens_per_sec_per_device=tps / n,
        step_ms_median=step_ms,
        step_ms_min=step_ms,
        step_ms_max=step_ms,
        flops_per_token=flops_per_token,
        tflops_per_device=tflops,
        bf16_peak_tflops=bf16_peak,
        precision_peak_tflops=own_peak,
        mfu_vs_bf16_peak=tflops / bf16_peak if bf16_peak else None,
        mfu_vs_precision_peak=tflops / own_peak if own_peak else None,
        mfu_note=note,
        peak_memory_allocated_gib=p.peak_memory_gib,
    ).model_copy(update=timing)


def _normal(value: float) -> bool:
    """Finite and not lost to underflow (all derived values come from positive inputs)."""
    return math.isfinite(value) and abs(value) >= sys.float_info.min


def _check_derived(field: str, p: ImportPoint, summary: Summary, max_num_devices: int, from_log: bool) -> None:
    """422 naming the input when a value derived from it would not be a finite, normal number (from a log: its
    text, whose median step time gave the point's throughput)."""
    source = p.throughput_field()
    derived = {
        name: getattr(summary, name)
        for name in (
            "tokens_per_sec",
            "tokens_per_sec_per_device",
            "tflops_per_device",
            "mfu_vs_bf16_peak",
            "mfu_vs_precision_peak",
        )
    }
    # E(N) divides by the ideal throughput X(N0) * N / N0, N up to the largest N of the import.
    derived["ideal tokens_per_sec at N=" + str(max_num_devices)] = summary.tokens_per_sec * max_num_devices
    errors = []
    if bad := [name for name, v in derived.items() if v is not None and not _normal(v)]:
        errors.append(
            FieldError(
                field=f"{field}.{source}",
                message=(
                    f"{getattr(p, source)} gives {', '.join(bad)} outside the finite float range "
                    "(overflow or underflow)"
                ),
            )
        )
    if not _normal(summary.step_ms_median):
        name = "step_ms" if p.step_ms is not None else source
        errors.append(
            FieldError(
                field=f"{field}.{name}",
                message=(
                    f"{getattr(p, name)} gives step_ms_median {summary.step_ms_median} outside the finite float range"
                ),
            )
        )
    if errors and from_log:
        errors = [_log_step_time_error(field, p.step_ms, e.message.split(" gives ", 1)[-1]) for e in errors[:1]]
    if errors:
        raise _bad(errors, "values that would not be finite")


def _log_step_time_error(field: str, step_ms: float | None, what: str) -> FieldError:
    return FieldError(field=f"{field}.text", message=f"the log's median step time {step_ms:.6g} ms gives {what}")


# How far a given step_ms may stray from tokens_per_step / throughput: published figures are rounded (a
# TPS/GPU to three digits, a step time to 0.1 s), which moves the two a few tenths of a percent apart.
STEP_MS_TOLERANCE = 0.05


def _check_step_time(field: str, p: ImportPoint, run: RunSpec) -> None:
    """422 naming step_ms when it contradicts the throughput: one run's tokens per step over its step time is its
    throughput, and S(N), E(N) and the projection read both (a step time off by a factor would be charged as the
    run's own)."""
    if p.step_ms is None:
        return
    implied = run.tokens_per_step / p.global_tokens_per_sec() * 1000.0
    if abs(p.step_ms - implied) > STEP_MS_TOLERANCE * implied:
        source = p.throughput_field()
        raise _bad(
            [
                FieldError(
                    field=f"{field}.step_ms",
                    message=(
                        f"step_ms {p.step_ms:.6g} contradicts {source} {getattr(p, source):.6g}: at "
                        f"{run.tokens_per_step} tokens a step (seq_len x global batch) that throughput is a step of "
                        f"{implied:.6g} ms; give step_ms within {STEP_MS_TOLERANCE:.0%} of it, or leave it out"
                    ),
                )
            ],
            "step time and throughput disagree",
        )


def _result(
    field: str,
    p: ImportPoint,
    run: RunSpec,
    cluster: Cluster,
    max_num_devices: int,
    timing: dict[str, Any],
    from_log: bool = False,
) -> RunResult:
    env = _environment(field, p, cluster)
    final = p.final_loss if p.final_loss is not None else (p.loss_curve[-1][1] if p.loss_curve else None)
    summary = _summary(p, run, env, timing)
    _check_derived(field, p, summary, max_num_devices, from_log)
    if not from_log:
        _check_step_time(field, p, run)
    # No StepRecords: db.imports.step_chunks writes the curves as the steps (500,000 objects cost seconds).
    return RunResult(
        run_key=run.run_key(),
        status="succeeded",
        summary=summary,
        numerics=Numerics(
            final_loss=final,
            loss_curve=[v for _, v in p.loss_curve],
            eval_curve=[EvalPoint(step=s, loss=v) for s, v in p.eval_curve],
            data="imported",
        ),
        environment=env,
    )


def _point_steps(p: ImportPoint) -> ImportedSteps:
    """A JSON point's step rows: its loss curve (no step times: the point gives a median only)."""
    return ImportedSteps(rows=[(s, v, None, 0, False) for s, v in p.loss_curve], evals=list(p.eval_curve))


# ------------------------------------------------------------------------------------------------- logs


@dataclass(frozen=True)
class _FromLog:
    point: ImportPoint
    steps: ImportedSteps
    timing: dict[str, Any]  # Summary fields the log's timed steps give (their count, range, how they were taken)


def _tokens_per_step(body: ImportHead, log: ImportLog, field: str) -> int:
    """Global tokens per step of the log's point, as the experiment's batch settings give it (the matrix gives
    the same: tested by the import itself)."""
    if body.scaling == "strong":
        if body.global_batch_size is None:
            raise _bad([FieldError(field="global_batch_size", message="required for scaling 'strong'")])
        return body.global_batch_size * body.seq_len
    try:
        degrees = resolve_layout(log.layout, log.num_devices)
    except ValueError as exc:
        raise _bad([FieldError(field=f"{field}.layout", message=str(exc))]) from exc
    return (body.local_batch_size or 1) * degrees.dp_degree * body.seq_len


def _from_log(body: LogsImport, i: int, log: ImportLog) -> _FromLog:
    """An ImportPoint (and its step rows) from one log: the median step time of its timed steps, its loss per
    step, its held-out losses. 422 naming logs[i] when the log holds nothing readable or disagrees with the
    experiment's batch."""
    field = f"logs[{i}]"
    engine = log.engine or DEFAULT_LOG_ENGINES[log.format]
    tokens_per_step = _tokens_per_step(body, log, field)
    parsed = read_log(log.format, log.text.splitlines(), tokens_per_step=tokens_per_step, num_devices=log.num_devices)
    timed = [(r.step, r.step_ms) for r in parsed.steps if r.step_ms is not None and r.step_ms > 0]
    if not timed:
        raise _bad(
            [
                FieldError(
                    field=f"{field}.text",
                    message=f"no training step with a step time that the {log.format} parser can read "
                    f"({len(log.text.splitlines())} lines)",
                    allowed=[_LOG_LINE_EXAMPLES[log.format]],
                )
            ]
        )
    errors = []
    if parsed.global_batch_size is not None and parsed.global_batch_size * body.seq_len != tokens_per_step:
        errors.append(
            FieldError(
                field=f"{field}.text",
                message=(
                    f"the log's global batch size {parsed.global_batch_size} x seq_len {body.seq_len} = "
                    f"{parsed.global_batch_size * body.seq_len} tokens per step, but the experiment's batch gives "
                    f"{tokens_per_step} (local_batch_size {body.local_batch_size or 1} x data-parallel ranks x "
                    f"seq_len; strong scaling: global_batch_size x seq_len): set local_batch_size or "
                    "global_batch_size and seq_len to the run's"
                ),
            )
        )
    if len(parsed.steps) > MAX_CURVE_POINTS or len(parsed.evals) > MAX_CURVE_POINTS:
        errors.append(
            FieldError(
                field=f"{field}.text",
                message=f"{len(parsed.steps)} logged steps and {len(parsed.evals)} evaluations; at most "
                f"{MAX_CURVE_POINTS} of each per log (log less often, e.g. Megatron's --log-interval 10)",
            )
        )
    last = max([r.step for r in parsed.steps[-1:]] + [s for s, _ in parsed.evals[-1:]], default=0)
    if last > MAX_STEP:
        errors.append(
            FieldError(field=f"{field}.text", message=f"step {last} is beyond the {MAX_STEP} an experiment holds")
        )
    if errors:
        raise _bad(errors)
    warmup = min(log.warmup_steps, len(timed) - 1)  # at least one timed step
    timed_ms = [ms for _, ms in timed[warmup:]]
    median_ms = statistics.median(timed_ms)
    warm_steps = {step for step, _ in timed[:warmup]}
    try:
        point = ImportPoint(
            num_devices=log.num_devices,
            precision=log.precision,
            layout=log.layout,
            engine=engine,
            seed=log.seed,
            repeat=log.repeat,
            tokens_per_sec=tokens_per_step / median_ms * 1000.0,
            step_ms=median_ms,
            loss_curve=[(r.step, r.loss) for r in parsed.steps if r.loss is not None],
            eval_curve=[(s, v) for s, v in parsed.evals if v is not None],
            environment=log.environment,
        )
    except ValidationError as exc:
        raise _bad(
            [
                _log_step_time_error(field, median_ms, f"tokens_per_sec {e.message[0].lower()}{e.message[1:]}")
                if e.field in ("tokens_per_sec", "step_ms")
                else FieldError(field=f"{field}.{e.field}", message=e.message)
                for e in validation_errors(exc.errors())
            ]
        ) from exc
    rows = [(r.step, r.loss, r.step_ms, tokens_per_step, r.step in warm_steps) for r in parsed.steps]
    timing = {
        "num_timed_steps": len(timed_ms),
        "step_ms_min": min(timed_ms),
        "step_ms_max": max(timed_ms),
        "step_time_source": f"imported log:{log.format} (median of the logged steps after the first {warmup})",
    }
    return _FromLog(point, ImportedSteps(rows=rows, evals=list(point.eval_curve)), timing)


_LOG_LINE_EXAMPLES = {
    "megatron": " iteration      100/    1000 | consumed samples: ... | elapsed time per iteration (ms): 431.5 | ... "
    "| lm loss: 5.120000E+00 |",
    "torchtitan": "step: 100  loss:  5.1200  grad_norm: ...  memory: ...GiB(...%)  tps: 18,585  tflops: ...  mfu: ...%",
    "jsonl": '{"step": 99, "step_ms": 431.5, "loss": 5.12}',
}


# ------------------------------------------------------------------------------------------------ write


def _write(
    session: Session,
    spec: ExperimentSpec,
    runs: list[RunSpec],
    results: list[RunResult],
    steps: list[ImportedSteps],
    response: Response,
) -> dict:
    """Store the experiment in bounded transactions (db.imports): the head, results, steps and loss curves in
    chunks, then the runs' finish times."""
    exp, run_ids = record_imported(session, spec, runs, results)
    session.commit()
    for pairs in result_chunks(run_ids, results):
        pause_for_other_writers(session)
        store_results(session, pairs)
        session.commit()
    for rows in step_chunks(run_ids, steps):
        pause_for_other_writers(session)
        insert_steps(session, rows)
        session.commit()
    for curves in curve_chunks(run_ids, steps):
        pause_for_other_writers(session)
        insert_loss_curves(session, curves)
        session.commit()
    finish_imported(session, run_ids)
    session.commit()
    response.headers["Location"] = f"/experiments/{exp.id}"
    briefs = run_briefs(run_ids, runs, "succeeded")
    return experiment_read(exp, db.experiments.experiment_status(session, exp.id)) | {"runs": briefs}


def _import_points(
    session: Session,
    body: ImportHead,
    points: list[ImportPoint],
    clusters: dict[str, Cluster],
    response: Response,
    *,
    field: str,
    steps: list[ImportedSteps] | None = None,
    timings: list[dict[str, Any]] | None = None,
) -> dict:
    _check_sizes(points, field)
    max_n = max(p.num_devices for p in points)
    cluster = _cluster(body, clusters, max_n)
    runs = _match_points(points, cluster, _spec(body, points, engines=[DEFAULT_ENGINE]), field)
    results = [
        _result(f"{field}[{i}]", p, r, cluster, max_n, timing, from_log=timings is not None)
        for i, (p, r, timing) in enumerate(zip(points, runs, timings or [{}] * len(points)))
    ]
    return _write(session, _spec(body, points), runs, results, steps or [_point_steps(p) for p in points], response)


@router.post(
    "/import",
    status_code=201,
    response_model=ImportRead,
    responses={**WRITE_RESPONSES, 201: {"description": "Created; Location names the experiment."}},
    summary="Import runs measured elsewhere (a published table, another trainer's results)",
)
def import_experiment(
    body: Annotated[ExperimentImport, Body()],
    session: SessionDep,
    clusters: ClustersDep,
    _auth: WriteAuth,
    response: Response,
) -> Any:
    """Stores an experiment (source `import`) whose runs are succeeded and flagged `imported`, each with a
    summary (MFU when the device is in the peak table, else none, with the reason), its engine and seed, its
    loss curve (as step records and in the loss-curve table, as a measured run's), its held-out curve and its
    environment. The scaling report (with the fp8 loss verdict), the losses and compare endpoints then treat
    it like any measured experiment. A point's engine is a label: it is not checked against what the cluster
    offers (the run already happened); device and layout rules apply as to a submitted experiment."""
    return _import_points(session, body, body.points, clusters, response, field="points")


@router.post(
    "/import/logs",
    status_code=201,
    response_model=ImportRead,
    responses={**WRITE_RESPONSES, 201: {"description": "Created; Location names the experiment."}},
    summary="Import the training logs of runs made elsewhere (Megatron-LM / Primus, TorchTitan, JSON lines)",
)
def import_logs(
    body: Annotated[LogsImport, Body()],
    session: SessionDep,
    clusters: ClustersDep,
    _auth: WriteAuth,
    response: Response,
) -> Any:
    """One log per run, with the point it measured (precision, layout, N, engine, seed): each becomes an
    imported run with its throughput (global tokens per step / the median step time of its logged steps after
    `warmup_steps`; TorchTitan's tps is per device), its loss per logged step and its held-out losses. The
    experiment's seq_len and batch (local_batch_size, or global_batch_size for strong scaling) give the tokens
    per step; a Megatron log states its global batch size and must agree. A log with no readable step, or one
    that disagrees, is refused with a 422 naming `logs[i].text`. `scalebench import LOG... --format ...` posts
    here."""
    converted = [_from_log(body, i, log) for i, log in enumerate(body.logs)]
    return _import_points(
        session,
        body,
        [c.point for c in converted],
        clusters,
        response,
        field="logs",
        steps=[c.steps for c in converted],
        timings=[c.timing for c in converted],
    )
