"""Scaling curves computed on read: JSON, CSV and PNG of one experiment, its loss curves, and a comparison.

Every endpoint answers If-None-Match with 304 from a one-query fingerprint, before loading any run.
A full answer is kept in a small per-process LRU keyed by its ETag (which names the fingerprint, the path
and the query), so a second dashboard asking for an unchanged report gets the stored bytes instead of a
rebuild. A rebuild reads one aggregated row per (series, N) from the database (db.points.
load_scaling_points), not one per run; the summary medians are aggregated again only for points whose
succeeded runs changed (kept per process, keyed by each point's fingerprint), and only series whose
measured points changed are refitted (core.analysis.scaling keeps fits keyed by those points). So one finished run
costs one point's aggregation and one series' fits. SCALEBENCH_REPORT_CACHE=0 turns the answer cache off.
"""

from __future__ import annotations

import csv
import io
from collections.abc import MutableMapping
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

import db.points
from api import etag
from api.caches import AnswerCache, LruDict
from api.compare import CompareExperiment, CompareRead, compare
from api.deps import MAX_ID, NOT_MODIFIED, ExperimentId, ReadAuth, SessionDep
from api.problems import PROBLEM_RESPONSES, FieldError, ProblemError, found
from core.analysis.scaling import ScalingReport, build_report_from_points, loss_pairs, numerics_key, to_csv
from core.contracts.clusters import Cluster
from db.models import Experiment
from db.points import LossCurve

router = APIRouter(tags=["analysis"])
Baseline = Annotated[
    int | None,
    Query(
        ge=1,
        le=65536,
        description=(
            "N0 for scaling efficiency E(N) = X(N) / (X(N0) N / N0), e.g. 8 for one node; "
            "default: each series' smallest measured N. A series that did not measure it has no E(N) (its note "
            "says so); one that no series measured is a 422 listing the measured N."
        ),
    ),
]
FullSize = Annotated[
    int | None,
    Query(
        ge=1,
        le=1 << 20,
        description=(
            "N at which the Amdahl/USL curve fits give their X and E (amdahl.at_full_size, usl.at_full_size) when "
            "it lies within a series' measured range; outside it they give none (the fits describe the measured "
            "range only) and the series' notes point to GET /experiments/{id}/projection, which gives E(N) there "
            "with its 80% interval. Default: the cluster's max devices."
        ),
    ),
]
MAX_COMPARE = 8


def _point_values(request: Request) -> LruDict:
    """The app's cache of aggregated point values (api.caches)."""
    return request.app.state.caches.point_values


def _cache(request: Request) -> AnswerCache:
    """The app's cache of whole answers by ETag (api.caches)."""
    return request.app.state.caches.answers


def _fresh(
    request: Request, session: Session, experiment_id: int, load: bool = True
) -> tuple[dict, Response | None, Experiment | None]:
    """(ETag headers, a 304 when the client's copy is current, else the experiment or a 404 problem).
    The ETag is checked first: a poll of an unchanged experiment costs one small query. With load=False the
    experiment row is not read when an ETag exists (there is one only for an existing experiment), so that an
    answer from the answer cache costs no query beyond the fingerprint."""
    headers, unchanged = etag.check(request, session, [experiment_id])
    if unchanged:
        return headers, unchanged, None
    if headers and not load:
        return headers, None, None
    return headers, None, found(session.get(Experiment, experiment_id), "experiment", experiment_id)


def _full_sizes(clusters: dict[str, Cluster], full_size: int | None, names: set[str]) -> dict[str, int]:
    if full_size is not None:
        return {n: full_size for n in names}
    return {n: clusters[n].max_devices for n in names if n in clusters}


def _report(
    request: Request, session: Session, experiment_id: int, baseline: int | None, full_size: int | None
) -> ScalingReport:
    points = db.points.load_scaling_points(session, experiment_id, _point_values(request))
    cache = request.app.state.caches.numerics
    run_losses = _missing_digests(session, points, cache)
    session.close()  # hand the connection back before the CPU-bound build (loaded rows stay usable)
    sizes = _full_sizes(request.app.state.clusters, full_size, {p.key.cluster for p in points})
    report = build_report_from_points(
        points,
        baseline_num_devices=baseline,
        full_size_by_cluster=sizes,
        run_losses=run_losses,
        numerics_cache=cache,
    )
    if baseline is not None and report.series and all(s.baseline_num_devices is None for s in report.series):
        # a baseline no series measured gives no efficiency anywhere: say so rather than a report of nulls
        measured = sorted({p.num_devices for s in report.series for p in s.points if p.tokens_per_sec})
        message = f"N0={baseline} was not measured in any series"
        field = "query.baseline_num_devices"
        raise ProblemError(422, f"{field}: {message}", [FieldError(field=field, message=message, allowed=measured)])
    return report


def _missing_digests(session: Session, points: list, cache: MutableMapping) -> dict:
    """The curve digests of the runs of the fp8/bf16 pairs whose verdict and matched losses are not cached yet
    (one query, none when all are): a cold read recomputes only the pairs whose runs changed."""
    missing = [pair for pair in loss_pairs(points) if numerics_key(*pair) not in cache]
    ids = {i for f, b in missing for i in (*f.run_ids, *b.run_ids)}
    return db.points.load_run_digests(session, list(ids)) if ids else {}


@router.get(
    "/experiments/{experiment_id}/scaling",
    response_model=ScalingReport,
    responses={
        **PROBLEM_RESPONSES,
        **NOT_MODIFIED,
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with ?format=csv"},
    },
    summary="Scaling curves: X(N), E(N), fp8 speedup, MFU, memory, Amdahl/USL fits (JSON or CSV)",
    description=(
        "Each fp8 point of `speedups` carries its loss verdict against bf16 (loss_verdict, loss_gap, loss_gap_band, "
        "loss_numerics: the gap at the end of the run and its drift) and the time to the same loss (steps_ratio, "
        "effective_speedup = speedup / steps_ratio, their bands, time_to_loss with the matched checkpoints), "
        "computed from curve digests stored with each run and cached per pair. The Amdahl/USL fits describe the "
        "measured range only and give no value outside it; beyond it the one prediction is GET "
        "/experiments/{id}/projection (E(N) with its 80% interval). The CSV holds one row per series point "
        "(measured, failed, pending or missing), no fit values."
    ),
)
def get_scaling(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    baseline_num_devices: Baseline = None,
    full_size: FullSize = None,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv (one row per point).")] = "json",
) -> Any:
    headers, unchanged, _ = _fresh(request, session, experiment_id, load=False)
    if unchanged:
        return unchanged

    def build() -> tuple[str, bytes]:
        report = _report(request, session, experiment_id, baseline_num_devices, full_size)
        if format == "csv":
            return "text/csv; charset=utf-8", to_csv(report).encode()
        return "application/json", report.model_dump_json().encode()

    if format == "csv":
        headers["Content-Disposition"] = f'inline; filename="experiment-{experiment_id}-scaling.csv"'
    return _cache(request).answer(headers, build)


@router.get(
    "/experiments/{experiment_id}/scaling.png",
    response_class=Response,
    responses={**PROBLEM_RESPONSES, **NOT_MODIFIED, 200: {"content": {"image/png": {}}}},
    summary="Scaling curves as a PNG: throughput with the ideal line, efficiency, fp8 speedup",
)
def get_scaling_png(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    baseline_num_devices: Baseline = None,
    full_size: FullSize = None,
) -> Response:
    headers, unchanged, exp = _fresh(request, session, experiment_id)
    if unchanged:
        return unchanged

    assert exp is not None  # _fresh loads it when the client's copy is not current

    def build() -> tuple[str, bytes]:
        from api.plots import render_scaling_png  # matplotlib: imported by the first picture, not at start-up

        report = _report(request, session, experiment_id, baseline_num_devices, full_size)
        return "image/png", render_scaling_png(report, title=f"experiment {exp.id}: {exp.name} ({exp.cluster})")

    return _cache(request).answer(headers, build)


class LossesRead(BaseModel):
    experiment_id: int
    max_points: int = Field(description="Each curve holds at most this many points (first and last kept).")
    downsampling: str = Field(db.points.DOWNSAMPLING, description="How the curves were thinned.")
    curves: list[LossCurve] = Field(
        description=(
            "One curve per succeeded run: every seed and repeat (seed and engine in each), ordered by engine, "
            "cluster, layout, N, precision, seed, repeat; steps and losses, thinned; eval_steps and eval_losses: "
            "its held-out loss (empty when not evaluated), thinned the same way; source 'store' (the curve stored "
            "when the run was recorded or imported, stored_stride > 1 when that was already thinned) or 'steps' "
            "(thinned from step rows)."
        )
    )


LOSS_CSV_COLUMNS = (
    "run_id",
    "engine",
    "cluster",
    "precision",
    "layout",
    "num_devices",
    "seed",
    "repeat",
    "step",
    "loss",
    "eval_loss",
)


def losses_csv(curves: list[LossCurve]) -> str:
    """One row per run and step of the served curves: the training loss, and the held-out loss at the steps
    evaluated (empty where a step has only the other)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(LOSS_CSV_COLUMNS)
    for c in curves:
        train = dict(zip(c.steps, c.losses))
        held_out = dict(zip(c.eval_steps, c.eval_losses))
        head = (c.run_id, c.engine, c.cluster, c.precision, c.layout, c.num_devices, c.seed, c.repeat)
        for step in sorted(train.keys() | held_out.keys()):
            loss, eval_loss = train.get(step), held_out.get(step)
            w.writerow((*head, step, "" if loss is None else repr(loss), "" if eval_loss is None else repr(eval_loss)))
    return out.getvalue()


@router.get(
    "/experiments/{experiment_id}/losses",
    response_model=LossesRead,
    responses={
        **PROBLEM_RESPONSES,
        **NOT_MODIFIED,
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with ?format=csv (one row per run and step)"},
    },
    summary="Loss curves for fp8 vs bf16: every succeeded run (each seed and repeat), thinned (JSON or CSV)",
)
def get_losses(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    num_devices: Annotated[int | None, Query(ge=1, le=65536, description="Only curves at this N.")] = None,
    max_points: Annotated[int, Query(ge=2, le=2000, description="Points per curve at most.")] = 200,
    repeats: Annotated[
        Literal["all", "first"],
        Query(
            description=(
                "all (default): every run's curve; first: the first repeat of each seed only, one curve per point "
                "and seed (what the dashboard draws: repeats of a seed train on the same batches, and an "
                "experiment with many repeats would otherwise serve each curve many times)."
            )
        ),
    ] = "all",
    format: Annotated[
        Literal["json", "csv"],
        Query(
            description=(
                "json (default) or csv: one row per run and step (run_id, engine, cluster, precision, layout, "
                "num_devices, seed, repeat, step, loss, eval_loss), the served points (max_points=2000: every "
                "stored point)."
            )
        ),
    ] = "json",
) -> Any:
    headers, unchanged, _ = _fresh(request, session, experiment_id, load=False)
    if unchanged:
        return unchanged

    def build() -> tuple[str, bytes]:
        curves = db.points.loss_curves(
            session, experiment_id, max_points=max_points, num_devices=num_devices, every_repeat=repeats == "all"
        )
        if format == "csv":
            return "text/csv; charset=utf-8", losses_csv(curves).encode()
        body = LossesRead(experiment_id=experiment_id, max_points=max_points, curves=curves)
        return "application/json", body.model_dump_json().encode()

    if format == "csv":
        headers["Content-Disposition"] = f'inline; filename="experiment-{experiment_id}-losses.csv"'
    return _cache(request).answer(headers, build)


def _parse_ids(raw: str) -> list[int]:
    def bad(message: str) -> ProblemError:
        return ProblemError(
            422,
            f"query.experiments: {message}",
            [
                FieldError(
                    field="query.experiments",
                    message=message,
                    allowed=[f"2 to {MAX_COMPARE} comma-separated experiment ids, e.g. 3,7"],
                )
            ],
        )

    parts = [p.strip() for p in raw.split(",")]
    if any(not p.isdigit() or not 0 < int(p) <= MAX_ID for p in parts):
        raise bad(f"{raw!r} is not a comma-separated list of positive integer ids")
    ids = list(dict.fromkeys(int(p) for p in parts))
    if not 2 <= len(ids) <= MAX_COMPARE:
        raise bad(f"{len(ids)} distinct ids given; compare takes 2 to {MAX_COMPARE}")
    return ids


@router.get(
    "/compare",
    response_model=CompareRead,
    responses={**PROBLEM_RESPONSES, **NOT_MODIFIED},
    summary="Scaling of several experiments side by side, with X ratios to the first at each common N",
)
def get_compare(
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    experiments: Annotated[
        str,
        Query(
            max_length=200,
            description=(
                f"2 to {MAX_COMPARE} comma-separated experiment ids; the first is the reference of the ratios."
            ),
        ),
    ],
    baseline_num_devices: Baseline = None,
    full_size: FullSize = None,
) -> Any:
    ids = _parse_ids(experiments)
    headers, unchanged = etag.check(request, session, ids)
    if unchanged:
        return unchanged
    rows = {e.id: e for e in session.scalars(sa.select(Experiment).where(Experiment.id.in_(ids)))}
    if missing := [i for i in ids if i not in rows]:
        raise ProblemError(
            422,
            f"query.experiments: experiment(s) {missing} do not exist",
            [
                FieldError(
                    field="query.experiments", message=f"experiment(s) {', '.join(map(str, missing))} do not exist"
                )
            ],
        )

    def build() -> tuple[str, bytes]:
        points = db.points.load_scaling_points_many(session, ids, _point_values(request))
        cache = request.app.state.caches.numerics
        run_losses = _missing_digests(session, [p for i in ids for p in points[i]], cache)
        session.close()  # hand the connection back before the CPU-bound builds
        out = []
        for i in ids:
            sizes = _full_sizes(request.app.state.clusters, full_size, {p.key.cluster for p in points[i]})
            report = build_report_from_points(
                points[i],
                baseline_num_devices=baseline_num_devices,
                full_size_by_cluster=sizes,
                run_losses=run_losses,
                numerics_cache=cache,
            )
            out.append(
                CompareExperiment(
                    id=i, name=rows[i].name, cluster=rows[i].cluster, source=rows[i].source, report=report
                )
            )
        return "application/json", compare(out).model_dump_json().encode()

    return _cache(request).answer(headers, build)
