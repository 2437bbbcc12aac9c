"""Experiments: create (expand the matrix, store, enqueue after commit), list, read, cancel."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import db.experiments
from api import etag
from api.deps import CeleryDep, ClustersDep, ExperimentId, ReadAuth, SessionDep, WriteAuth
from api.guard import GuardedRoute
from api.problems import PROBLEM_RESPONSES, WRITE_RESPONSES, FieldError, ProblemError, data_path_problem, found
from api.schemas.experiments import (
    CancelRead,
    ExperimentCreated,
    ExperimentPage,
    ExperimentRead,
    ExperimentStatusName,
    RunBrief,
    decode_cursor,
    encode_cursor,
    experiment_brief,
    experiment_read,
    run_briefs,
    skipped_read,
)
from core.contracts.clusters import Cluster
from core.contracts.data_paths import DataPathError
from core.contracts.matrix import MatrixError, SkippedPoint, expand
from core.contracts.specs import ExperimentSpec, RunSpec
from db.experiments import ExperimentStatus
from db.models import RUN_STATUSES, Experiment
from worker.queue import dispatch_runs

router = APIRouter(prefix="/experiments", tags=["experiments"], route_class=GuardedRoute)

MAX_RUNS_PER_EXPERIMENT = 4096
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"
EXAMPLE = ExperimentSpec.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]
BROKER_DOWN_NOTE = "runs stay queued; the dispatcher publishes them when the broker answers again"


def _cluster(spec: ExperimentSpec, clusters: dict[str, Cluster]) -> Cluster:
    if spec.cluster not in clusters:
        raise ProblemError(
            422,
            f"unknown cluster {spec.cluster!r}",
            [FieldError(field="cluster", message=f"unknown cluster {spec.cluster!r}", allowed=sorted(clusters))],
        )
    return clusters[spec.cluster]


def _expand(spec: ExperimentSpec, cluster: Cluster) -> tuple[list[RunSpec], list[SkippedPoint]]:
    try:
        runs, skipped = expand(spec, cluster)
    except DataPathError as exc:
        raise data_path_problem(exc, cluster.data_roots) from exc
    except MatrixError as exc:
        errors = [
            FieldError(
                field="engines" if p.engine != "scalebench" and _engine_refused(p.reason) else "matrix",
                message=f"{p.engine}/{p.precision}/{p.layout}/N={p.num_devices}: {p.reason}",
            )
            for p in exc.skipped
        ]
        raise ProblemError(
            422, "the matrix has no valid point", errors, skipped=[s.model_dump() for s in skipped_read(exc.skipped)]
        ) from exc
    if len(runs) > MAX_RUNS_PER_EXPERIMENT:
        raise ProblemError(
            422,
            f"the matrix expands to {len(runs)} runs; the limit is {MAX_RUNS_PER_EXPERIMENT}",
            [FieldError(field="matrix", message="reduce gpu_counts, precisions, layouts, engines, seeds or repeats")],
        )
    return runs, skipped


def _engine_refused(reason: str) -> bool:
    """A skip that is the engine's (the cluster does not offer it, or it cannot run the point)."""
    return reason.startswith(("cluster ", "torchtitan ", "command:"))


def _request_hash(spec: ExperimentSpec) -> str:
    blob = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _skipped_again(exp: Experiment, clusters: dict[str, Cluster]) -> list[SkippedPoint]:
    """Skipped points of a stored experiment (expansion is deterministic); [] if its cluster changed."""
    cluster = clusters.get(exp.cluster)
    try:
        return expand(ExperimentSpec.model_validate(exp.spec), cluster)[1] if cluster else []
    except ValueError:
        return []


def _replay(
    session: Session, exp: Experiment, request_hash: str, clusters: dict[str, Cluster], response: Response
) -> dict[str, Any]:
    """The stored answer for a repeated Idempotency-Key, or 409 when the body differs."""
    if exp.request_hash != request_hash:
        raise ProblemError(
            409,
            "Idempotency-Key was already used with another request body",
            [
                FieldError(
                    field="header.Idempotency-Key", message=f"already used for experiment {exp.id} with another body"
                )
            ],
        )
    runs = db.experiments.list_runs(session, exp.id, limit=MAX_RUNS_PER_EXPERIMENT)
    skipped = _skipped_again(exp, clusters)
    undispatched = [r.id for r in runs if r.status == "queued" and r.dispatched_at is None]
    response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/experiments/{exp.id}"
    return experiment_read(exp, db.experiments.experiment_status(session, exp.id)) | {
        "runs": [RunBrief.model_validate(r, from_attributes=True) for r in runs],
        "skipped": skipped_read(skipped),
        "dispatched": not undispatched,
        "dispatch_message": f"{len(undispatched)} runs not yet published; {BROKER_DOWN_NOTE}" if undispatched else None,
    }


MAX_IDEMPOTENCY_KEY_CHARS = 200


def _idempotency_key(raw: str | None) -> str | None:
    """The header as the client wrote it: HTTP hands header bytes over as latin-1, so a UTF-8 key is decoded
    again and counted in characters (not bytes)."""
    if raw is None:
        return None
    try:
        key = raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        key = None
    if key is None or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        message = f"must be UTF-8 text of at most {MAX_IDEMPOTENCY_KEY_CHARS} characters" + (
            f" ({len(key)} were sent)" if key is not None else " (it is not valid UTF-8)"
        )
        raise ProblemError(
            422, f"Idempotency-Key {message}", [FieldError(field="header.Idempotency-Key", message=message)]
        )
    return key


@router.post(
    "",
    status_code=201,
    response_model=ExperimentCreated,
    responses={**WRITE_RESPONSES, 201: {"description": "Created; Location names the experiment."}},
    summary="Create an experiment: expand the matrix into runs and enqueue them",
)
def create_experiment(
    spec: Annotated[
        ExperimentSpec, Body(openapi_examples={"llama3-8b": {"summary": "8B fsdp fp8 scaling", "value": EXAMPLE}})
    ],
    session: SessionDep,
    celery: CeleryDep,
    clusters: ClustersDep,
    auth: WriteAuth,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=4 * MAX_IDEMPOTENCY_KEY_CHARS,
            pattern=NO_CONTROL_CHARS,
            description=f"Repeat-safe creation: the same key and body from the same token return the same experiment; "
            f"the same key with another body is a 409 (keys are per token). UTF-8, at most "
            f"{MAX_IDEMPOTENCY_KEY_CHARS} characters.",
        ),
    ] = None,
) -> Any:
    """Expands engine x precision x layout x N x seed x repeat into runs (points that cannot exist are skipped, with
    reasons), stores the experiment and its runs, commits, then publishes one message per run on the
    cluster's queue. If the broker is down the response says `dispatched: false` and a background
    dispatcher publishes the runs later."""
    client_key = _idempotency_key(idempotency_key)
    # per token: another token sending the same key makes its own experiment
    idempotency_key = db.experiments.scoped_idempotency_key(auth.id, client_key) if client_key else None
    cluster = _cluster(spec, clusters)
    request_hash = _request_hash(spec)
    if idempotency_key and (existing := db.experiments.find_by_idempotency_key(session, idempotency_key)):
        return _replay(session, existing, request_hash, clusters, response)
    runs, skipped = _expand(spec, cluster)
    try:
        exp, run_ids = db.experiments.create_experiment(
            session, spec, runs, cluster.queue_name, idempotency_key=idempotency_key, request_hash=request_hash
        )
        session.commit()
    except IntegrityError:  # a concurrent request with the same Idempotency-Key won the race
        session.rollback()
        existing = db.experiments.find_by_idempotency_key(session, idempotency_key) if idempotency_key else None
        if existing is None:
            raise
        return _replay(session, existing, request_hash, clusters, response)
    outcome = dispatch_runs(session, celery, run_ids)  # enqueue only after the commit
    session.commit()
    response.headers["Location"] = f"/experiments/{exp.id}"
    counts = {s: 0 for s in RUN_STATUSES} | {"queued": len(run_ids)}
    briefs = run_briefs(run_ids, runs, "queued")
    message = None if outcome.ok else f"{outcome.error}; {len(run_ids) - len(outcome.published)} {BROKER_DOWN_NOTE}"
    return experiment_read(exp, ExperimentStatus("queued", counts)) | {
        "runs": briefs,
        "skipped": skipped_read(skipped),
        "dispatched": outcome.ok,
        "dispatch_message": message,
    }


@router.get("", response_model=ExperimentPage, responses=PROBLEM_RESPONSES, summary="List experiments")
def list_experiments(
    session: SessionDep,
    _auth: ReadAuth,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    cursor: Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page.")] = None,
    status: Annotated[ExperimentStatusName | None, Query(description="Derived experiment status.")] = None,
    tag: Annotated[str | None, Query(min_length=1, max_length=64, pattern=NO_CONTROL_CHARS)] = None,
    cluster: Annotated[str | None, Query(min_length=1, max_length=100, pattern=NO_CONTROL_CHARS)] = None,
) -> Any:
    """Newest first, keyset-paginated; filters combine with AND."""
    rows = db.experiments.list_experiments(
        session, limit=limit, before_id=decode_cursor(cursor), status=status, tag=tag, cluster=cluster
    )
    page, more = rows[:limit], len(rows) > limit
    statuses = db.experiments.statuses_for(session, [e.id for e in page])
    body = (
        ExperimentPage(
            items=[experiment_brief(e, statuses[e.id]) for e in page],
            next_cursor=encode_cursor(page[-1].id) if more else None,
        )
        .model_dump_json()
        .encode()
    )
    page_etag = etag.body_etag(request, body)  # the dashboard polls this list: unchanged pages answer 304
    if etag.matches(request, page_etag):
        return etag.not_modified(page_etag)
    return Response(body, media_type="application/json", headers={"ETag": page_etag, **etag.NO_CACHE})


def _get_or_404(session: Session, experiment_id: int) -> Experiment:
    return found(db.experiments.get_experiment(session, experiment_id), "experiment", experiment_id)


@router.get(
    "/{experiment_id}",
    response_model=ExperimentRead,
    responses=PROBLEM_RESPONSES,
    summary="An experiment: spec, status derived from its runs, counts per status, progress",
)
def get_experiment(
    experiment_id: ExperimentId, session: SessionDep, _auth: ReadAuth, request: Request, response: Response
) -> Any:
    headers, unchanged = etag.check(request, session, [experiment_id])  # polls: 304 from one small query
    if unchanged:
        return unchanged
    response.headers.update(headers)
    # experiment + run counts: one round trip
    return experiment_read(
        *found(db.experiments.experiment_with_status(session, experiment_id), "experiment", experiment_id)
    )


@router.post(
    "/{experiment_id}/cancel",
    response_model=CancelRead,
    responses=WRITE_RESPONSES,
    summary="Cancel: queued runs become cancelled; pending and running runs are marked for their worker",
)
def cancel_experiment(experiment_id: ExperimentId, session: SessionDep, _auth: WriteAuth) -> CancelRead:
    _get_or_404(session, experiment_id)
    num_cancelled, num_marked = db.experiments.cancel_experiment(session, experiment_id)
    session.commit()
    status = db.experiments.experiment_status(session, experiment_id).status
    return CancelRead(
        experiment_id=experiment_id,
        num_cancelled=num_cancelled,
        num_cancel_requested=num_marked,
        num_stopping=db.experiments.count_stopping(session, experiment_id),
        status=status,  # type: ignore[arg-type]  # db reads the status as str; its values are ExperimentStatusName's
    )
