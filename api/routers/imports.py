"""POST /experiments/import: runs measured elsewhere (a published table, another trainer's logs) get the same
curves. The points pass the same validation as a submitted experiment: the matrix they span is expanded by
core.contracts.matrix.expand on the cluster, and a point the expansion skips is refused with the skip reason.

Every value stored is finite and storable text, and so is every value derived from it (per-device
throughput, step time, TFLOP/s, MFU, the ideal throughput of E(N)): an input whose derived value would
overflow or underflow (tokens_per_sec 1e308 or 5e-324) is refused with a 422 naming the input. The rows
are written in bounded transactions (db.imports), so a large import never holds SQLite's write lock long.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Response
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

import db.experiments
from api.deps import ClustersDep, SessionDep, WriteAuth
from api.guard import GuardedRoute
from api.problems import WRITE_RESPONSES, FieldError, ProblemError, validation_errors
from api.schemas.experiments import ExperimentRead, RunBrief, experiment_read
from core.catalog.hardware import peak_tflops
from core.catalog.shapes import get_shape
from core.contracts.clusters import Cluster
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import (
    Environment,
    ExperimentSpec,
    ModelName,
    Numerics,
    Precision,
    RunResult,
    RunSpec,
    ScalingMode,
    Summary,
    Text,
    bad_values,
    check_layout,
    check_text,
)
from db.imports import (
    finish_imported,
    insert_steps,
    pause_for_other_writers,
    record_imported,
    result_chunks,
    step_chunks,
    store_results,
)

router = APIRouter(prefix="/experiments", tags=["experiments"], route_class=GuardedRoute)
MAX_POINTS = 4096
MAX_CURVE_POINTS = 10_000  # per point
MAX_TOTAL_CURVE_POINTS = 500_000
UNKNOWN_TORCH = "unknown (imported)"


class ImportPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_devices: StrictInt = Field(ge=1, le=65536)
    precision: Precision
    layout: str = Field(description="Layout template, e.g. fsdp, hsdp:shard=8, tp=2+fsdp.")
    tokens_per_sec: float | None = Field(None, gt=0, description="Global tokens/s (give this or the per-device value).")
    tokens_per_sec_per_device: float | None = Field(None, gt=0, description="Tokens/s per device (e.g. TPS/GPU).")
    step_ms: float | None = Field(None, gt=0, description="Median step time; default derived from tokens per step.")
    peak_memory_gib: float | None = Field(None, ge=0)
    final_loss: float | None = None
    loss_curve: list[float] = Field([], max_length=MAX_CURVE_POINTS, description="Loss per step, step 0 first.")
    environment: dict[str, Any] = Field({}, description="core.contracts.specs.Environment fields (torch_version, ...).")
    repeat: StrictInt = Field(0, ge=0, le=19)

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        return check_layout(v)

    @model_validator(mode="after")
    def _one_throughput(self) -> ImportPoint:
        if (self.tokens_per_sec is None) == (self.tokens_per_sec_per_device is None):
            raise ValueError("give exactly one of tokens_per_sec (global) or tokens_per_sec_per_device")
        return self

    def global_tokens_per_sec(self) -> float:
        return self.tokens_per_sec or self.tokens_per_sec_per_device * self.num_devices  # type: ignore[operator]


class ExperimentImport(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    name: Text = Field(min_length=1, max_length=200)
    model: ModelName
    num_layers: int | None = Field(None, ge=1, le=256)
    cluster: Text = Field(
        min_length=1,
        max_length=63,
        description="A configured cluster, or a new name (then vendor and device_name are required).",
    )
    vendor: Literal["nvidia", "amd", "cpu"] | None = None
    device_name: Text | None = Field(
        None, min_length=1, max_length=200, description="Device name; MFU is computed when the peak table knows it."
    )
    scaling: ScalingMode = "weak"
    seq_len: int = Field(2048, ge=16, le=131072)
    local_batch_size: int | None = Field(None, ge=1, le=4096)
    global_batch_size: int | None = Field(None, ge=1, le=1 << 20)
    compile: bool = False
    activation_checkpointing: Literal["none", "full"] = "none"
    fp8_all_gather: bool = False
    tags: list[Annotated[str, Field(min_length=1, max_length=64), AfterValidator(check_text)]] = Field(
        [], max_length=31
    )
    points: list[ImportPoint] = Field(min_length=1, max_length=MAX_POINTS)


class ImportRead(ExperimentRead):
    runs: list[RunBrief]


# ------------------------------------------------------------------------------------------- building


def _bad(errors: list[FieldError], detail: str = "invalid import") -> ProblemError:
    return ProblemError(422, f"{detail}: " + "; ".join(f"{e.field}: {e.message}" for e in errors[:5]), errors)


def _cluster(body: ExperimentImport, clusters: dict[str, Cluster]) -> Cluster:
    """The configured cluster, or one described by the body (sized to the largest N imported)."""
    if body.cluster in clusters:
        return clusters[body.cluster]
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
            max_nodes=max(p.num_devices for p in body.points),
            launcher="local",
            queue="import",
        )
    except ValidationError as exc:
        raise _bad([FieldError(field="cluster", message=e["msg"]) for e in exc.errors()]) from exc


def _spec(body: ExperimentImport) -> ExperimentSpec:
    pts = body.points
    try:
        return ExperimentSpec(
            name=body.name,
            model=body.model,
            num_layers=body.num_layers,
            cluster=body.cluster,
            gpu_counts=sorted({p.num_devices for p in pts}),
            precisions=list(dict.fromkeys(p.precision for p in pts)),
            layouts=list(dict.fromkeys(p.layout for p in pts)),
            scaling=body.scaling,
            seq_len=body.seq_len,
            local_batch_size=body.local_batch_size,
            global_batch_size=body.global_batch_size,
            steps=max([2] + [len(p.loss_curve) for p in pts]),
            warmup_steps=0,
            repeats=max(p.repeat for p in pts) + 1,
            compile=body.compile,
            activation_checkpointing=body.activation_checkpointing,
            fp8_all_gather=body.fp8_all_gather,
            tags=list(dict.fromkeys([*body.tags, "imported"])),
        )
    except ValidationError as exc:
        raise _bad(validation_errors(list(exc.errors()))) from exc


def _match_points(body: ExperimentImport, cluster: Cluster, spec: ExperimentSpec) -> list[RunSpec]:
    """The expanded RunSpec of every point, in order; 422 naming each point the matrix refuses or repeats."""
    try:
        runs, skipped = expand(spec, cluster)
    except MatrixError as exc:
        runs, skipped = [], exc.skipped
    by_point = {(r.precision, r.layout, r.num_devices, r.repeat): r for r in runs}
    why = {(s.precision, s.layout, s.num_devices): s.reason for s in skipped}
    errors: list[FieldError] = []
    seen: dict[tuple[str, str, int, int], int] = {}
    out: list[RunSpec | None] = []
    for i, p in enumerate(body.points):
        key = (p.precision, p.layout, p.num_devices, p.repeat)
        if key in seen:
            errors.append(
                FieldError(
                    field=f"points[{i}]",
                    message=f"same precision, layout, num_devices and repeat as points[{seen[key]}]",
                )
            )
        elif key not in by_point:
            errors.append(FieldError(field=f"points[{i}]", message=why.get(key[:3], "not a point of the matrix")))
        seen.setdefault(key, i)
        out.append(by_point.get(key))
    if errors:
        raise _bad(errors, "points the matrix refuses")
    return [r for r in out if r is not None]  # no errors: every point was found


def _environment(i: int, p: ImportPoint, cluster: Cluster) -> Environment:
    if bad := bad_values(p.environment):
        raise _bad([FieldError(field=f"points[{i}].environment.{path}", message=why) for path, why in bad])
    unknown = sorted(set(p.environment) - set(Environment.model_fields))
    if unknown:
        raise _bad(
            [
                FieldError(
                    field=f"points[{i}].environment.{k}",
                    message="unknown environment field",
                    allowed=sorted(Environment.model_fields),
                )
                for k in unknown
            ]
        )
    defaults = {
        "vendor": cluster.vendor,
        "device_name": cluster.device_name,
        "device_count": p.num_devices,
        "world_size": p.num_devices,
        "torch_version": UNKNOWN_TORCH,
    }
    try:
        return Environment.model_validate(defaults | p.environment)
    except ValidationError as exc:
        raise _bad(
            [
                FieldError(field=f"points[{i}].environment.{'.'.join(map(str, e['loc']))}", message=e["msg"])
                for e in exc.errors()
            ]
        ) from exc


def _summary(p: ImportPoint, run: RunSpec, env: Environment) -> Summary:
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
    )


def _normal(value: float) -> bool:
    """Finite and not lost to underflow (all derived values come from positive inputs)."""
    return math.isfinite(value) and abs(value) >= sys.float_info.min


def _check_derived(i: int, p: ImportPoint, summary: Summary, max_num_devices: int) -> None:
    """422 naming the input when a value derived from it would not be a finite, normal number."""
    source = "tokens_per_sec" if p.tokens_per_sec is not None else "tokens_per_sec_per_device"
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
                field=f"points[{i}].{source}",
                message=(
                    f"{getattr(p, source)} gives {', '.join(bad)} outside the finite float range "
                    "(overflow or underflow)"
                ),
            )
        )
    if not _normal(summary.step_ms_median):
        field = "step_ms" if p.step_ms is not None else source
        errors.append(
            FieldError(
                field=f"points[{i}].{field}",
                message=(
                    f"{getattr(p, field)} gives step_ms_median {summary.step_ms_median} outside the finite float range"
                ),
            )
        )
    if errors:
        raise _bad(errors, "values that would not be finite")


def _result(i: int, p: ImportPoint, run: RunSpec, cluster: Cluster, max_num_devices: int) -> RunResult:
    env = _environment(i, p, cluster)
    final = p.final_loss if p.final_loss is not None else (p.loss_curve[-1] if p.loss_curve else None)
    summary = _summary(p, run, env)
    _check_derived(i, p, summary, max_num_devices)
    # No StepRecords: db.imports.step_chunks writes the loss curve as the steps (500,000 objects cost seconds).
    return RunResult(
        run_key=run.run_key(),
        status="succeeded",
        summary=summary,
        numerics=Numerics(final_loss=final, loss_curve=p.loss_curve),
        environment=env,
    )


@router.post(
    "/import",
    status_code=201,
    response_model=ImportRead,
    responses={**WRITE_RESPONSES, 201: {"description": "Created; Location names the experiment."}},
    summary="Import runs measured elsewhere (a published table, another trainer's logs)",
)
def import_experiment(
    body: Annotated[ExperimentImport, Body()],
    session: SessionDep,
    clusters: ClustersDep,
    _auth: WriteAuth,
    response: Response,
) -> Any:
    """Stores an experiment (source `import`) whose runs are succeeded and flagged `imported`, each with a
    summary (MFU when the device is in the peak table, else none, with the reason), its loss curve as
    step records, and its environment. The scaling, losses and compare endpoints then treat it like any
    measured experiment."""
    if sum(len(p.loss_curve) for p in body.points) > MAX_TOTAL_CURVE_POINTS:
        raise _bad([FieldError(field="points", message=f"more than {MAX_TOTAL_CURVE_POINTS} loss-curve points in all")])
    cluster = _cluster(body, clusters)
    spec = _spec(body)
    runs = _match_points(body, cluster, spec)
    max_n = max(p.num_devices for p in body.points)
    results = [_result(i, p, r, cluster, max_n) for i, (p, r) in enumerate(zip(body.points, runs))]
    # Bounded transactions (db.imports): the head, results and steps in chunks, then the runs' finish times.
    exp, run_ids = record_imported(session, spec, runs, results)
    session.commit()
    for pairs in result_chunks(run_ids, results):
        pause_for_other_writers(session)
        store_results(session, pairs)
        session.commit()
    for rows in step_chunks(run_ids, results):
        pause_for_other_writers(session)
        insert_steps(session, rows)
        session.commit()
    finish_imported(session, run_ids)
    session.commit()
    response.headers["Location"] = f"/experiments/{exp.id}"
    briefs = [
        RunBrief(
            id=i,
            run_key=r.run_key(),
            precision=r.precision,
            layout=r.layout,
            num_devices=r.num_devices,
            repeat=r.repeat,
            status="succeeded",
        )
        for i, r in zip(run_ids, runs)
    ]
    return experiment_read(exp, db.experiments.experiment_status(session, exp.id)) | {"runs": briefs}
