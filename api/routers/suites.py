"""Suites: saved experiment templates on a cron schedule. Create, list, read, update, trigger now.

The scheduler's nightly tick (worker/nightly.py) reads suites from the database every tick: a new or changed suite takes
effect without a restart. A trigger creates the experiment through the same path as a scheduled firing.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import db.suites
from api.deps import CeleryDep, ClustersDep, ReadAuth, SessionDep, SuiteId, WriteAuth
from api.guard import GuardedRoute
from api.problems import PROBLEM_RESPONSES, FieldError, ProblemError, data_path_problem, found
from api.schemas.nightly import SuiteCreate, SuiteFiringRead, SuiteRead, SuiteUpdate, TriggerRead
from core.contracts.data_paths import DataPathError
from core.contracts.matrix import MatrixError
from db.base import utcnow
from db.models import Suite
from worker.queue import dispatch_runs

router = APIRouter(prefix="/suites", tags=["suites"], route_class=GuardedRoute)


def _problem(exc: db.suites.SuiteError) -> ProblemError:
    return ProblemError(422, str(exc), [FieldError(field=exc.field, message=exc.message, allowed=exc.allowed)])


def suite_read(suite: Suite) -> dict[str, Any]:
    configs = db.suites.metric_configs(suite)
    effective = {name: (c.limit if c.limit is not None else c.threshold) for name, c in configs.items()}
    return SuiteRead.model_validate(suite).model_dump() | {"effective_thresholds": effective}


def _get_or_404(session: Session, suite_id: int) -> Suite:
    return found(db.suites.get_suite(session, suite_id), "suite", suite_id)


@router.post(
    "",
    status_code=201,
    response_model=SuiteRead,
    responses=PROBLEM_RESPONSES,
    summary="Create a suite: an experiment template fired on a cron schedule (default nightly)",
)
def create_suite(
    body: SuiteCreate, session: SessionDep, clusters: ClustersDep, _auth: WriteAuth, response: Response
) -> Any:
    cluster_name = body.cluster or body.spec.cluster
    if cluster_name not in clusters:
        raise ProblemError(
            422,
            f"unknown cluster {cluster_name!r}",
            [FieldError(field="cluster", message=f"unknown cluster {cluster_name!r}", allowed=sorted(clusters))],
        )
    if db.suites.get_suite_by_name(session, body.name) is not None:
        raise _name_taken(body.name)
    try:
        db.suites.check_expands(body.spec, clusters[cluster_name])
        suite = db.suites.create_suite(
            session,
            name=body.name,
            spec=body.spec,
            cluster=cluster_name,
            schedule=body.schedule,
            enabled=body.enabled,
            thresholds=body.thresholds,
            baseline_nights=body.baseline_nights,
            concurrency_policy=body.concurrency_policy,
            max_queued_runs=body.max_queued_runs,
        )
        session.commit()
    except db.suites.SuiteError as exc:
        raise _problem(exc) from exc
    except DataPathError as exc:
        raise data_path_problem(exc, clusters[cluster_name].data_roots, "spec.data_path") from exc
    except MatrixError as exc:
        raise ProblemError(
            422,
            "the suite's matrix has no valid point on its cluster",
            [
                FieldError(field="spec", message=f"{p.engine}/{p.precision}/{p.layout}/N={p.num_devices}: {p.reason}")
                for p in exc.skipped
            ],
        ) from exc
    except IntegrityError as exc:  # a concurrent request created the name between the check and the insert
        session.rollback()
        if db.suites.get_suite_by_name(session, body.name) is None:
            raise
        raise _name_taken(body.name) from exc
    response.headers["Location"] = f"/suites/{suite.id}"
    return suite_read(suite)


def _name_taken(name: str) -> ProblemError:
    return ProblemError(
        409, f"a suite named {name!r} exists", [FieldError(field="name", message="already used by another suite")]
    )


@router.get("", response_model=list[SuiteRead], responses=PROBLEM_RESPONSES, summary="List suites")
def list_suites(session: SessionDep, _auth: ReadAuth, enabled: bool | None = None) -> Any:
    return [suite_read(s) for s in db.suites.list_suites(session, enabled=enabled)]


@router.get("/{suite_id}", response_model=SuiteRead, responses=PROBLEM_RESPONSES, summary="A suite")
def get_suite(suite_id: SuiteId, session: SessionDep, _auth: ReadAuth) -> Any:
    return suite_read(_get_or_404(session, suite_id))


@router.patch(
    "/{suite_id}",
    response_model=SuiteRead,
    responses=PROBLEM_RESPONSES,
    summary="Enable, disable, reschedule, change thresholds or the concurrency policy (next firing recomputed)",
)
def update_suite(suite_id: SuiteId, body: SuiteUpdate, session: SessionDep, _auth: WriteAuth) -> Any:
    suite = _get_or_404(session, suite_id)
    try:
        db.suites.update_suite(
            session,
            suite,
            enabled=body.enabled,
            schedule=body.schedule,
            thresholds=body.thresholds,
            baseline_nights=body.baseline_nights,
            concurrency_policy=body.concurrency_policy,
            max_queued_runs=body.max_queued_runs,
        )
    except db.suites.SuiteError as exc:
        session.rollback()
        raise _problem(exc) from exc
    session.commit()
    return suite_read(suite)


@router.get(
    "/{suite_id}/firings",
    response_model=list[SuiteFiringRead],
    responses=PROBLEM_RESPONSES,
    summary="The suite's firings, newest first: the experiment each created, or why it was skipped or failed",
)
def list_firings(
    suite_id: SuiteId, session: SessionDep, _auth: ReadAuth, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> Any:
    _get_or_404(session, suite_id)
    return db.suites.list_firings(session, suite_id, limit)


@router.post(
    "/{suite_id}/trigger",
    status_code=201,
    response_model=TriggerRead,
    responses=PROBLEM_RESPONSES,
    summary="Fire the suite now (its schedule is unchanged; the concurrency policy does not apply, the queued-run "
    "cap does: 409)",
)
def trigger_suite(
    suite_id: SuiteId,
    session: SessionDep,
    celery: CeleryDep,
    clusters: ClustersDep,
    _auth: WriteAuth,
    response: Response,
) -> TriggerRead:
    suite = _get_or_404(session, suite_id)
    fired = db.suites.fire_suite(session, suite, clusters, utcnow(), trigger="manual")
    session.commit()
    if fired.skipped is not None:  # the queued-run cap (a manual trigger ignores the concurrency policy)
        raise ProblemError(
            409,
            f"the suite was not fired: {fired.skipped}",
            [FieldError(field="max_queued_runs", message=fired.skipped)],
        )
    if fired.experiment_id is None:
        raise ProblemError(
            422,
            f"the suite could not fire: {fired.error}",
            [
                FieldError(
                    field="cluster" if (fired.error or "").startswith("cluster") else "spec",
                    message=fired.error or "",
                    allowed=sorted(clusters) if (fired.error or "").startswith("cluster") else None,
                )
            ],
        )
    dispatched = dispatch_runs(session, celery, fired.run_ids).ok  # enqueue only after the commit
    session.commit()
    response.headers["Location"] = f"/experiments/{fired.experiment_id}"
    return TriggerRead(
        suite_id=suite.id, experiment_id=fired.experiment_id, num_runs=len(fired.run_ids), dispatched=dispatched
    )
