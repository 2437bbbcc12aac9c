"""Regressions found by the nightly checks: list (filters), one with its env diff, its metric's history with
the baseline band, acknowledge (someone is on it) and resolve (accept: the baseline re-forms)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

import db.regressions
from api.deps import ReadAuth, ReaderAuth, RegressionId, SessionDep, SuiteIdQuery, WriteAuth
from api.guard import GuardedRoute
from api.problems import PROBLEM_RESPONSES, FieldError, ProblemError, found
from api.schemas.experiments import decode_cursor, encode_cursor
from api.schemas.nightly import (
    MetricName,
    RegressionDetail,
    RegressionHistory,
    RegressionPage,
    RegressionRead,
    RegressionStatus,
)
from core.analysis.regression import DEFAULT_METRICS, OPEN_STATES
from db.models import Regression

router = APIRouter(prefix="/regressions", tags=["regressions"], route_class=GuardedRoute)


def regression_read(row: Regression, detail: bool = False) -> dict[str, Any]:
    schema = RegressionDetail if detail else RegressionRead
    return schema.model_validate(row).model_dump() | {
        "is_open": row.status in OPEN_STATES and row.resolved_at is None,
        "likely_cause": (row.env_diff or {}).get("likely_cause", []),
    }


def _get_or_404(session: Session, regression_id: int) -> Regression:
    return found(db.regressions.get_regression(session, regression_id), "regression", regression_id)


def _utc(since: datetime) -> datetime:
    """`since` in UTC; a time without an offset is UTC. 422 when the offset moves it out of years 1-9999."""
    if since.tzinfo is None:
        return since.replace(tzinfo=UTC)
    try:
        return since.astimezone(UTC)
    except OverflowError as exc:
        raise ProblemError(
            422,
            f"since {since.isoformat()} is outside years 1-9999 in UTC",
            [FieldError(field="since", message="in UTC it falls outside years 1-9999")],
        ) from exc


@router.get(
    "",
    response_model=RegressionPage,
    responses=PROBLEM_RESPONSES,
    summary="List regressions, newest first (filters combine with AND)",
)
def list_regressions(
    session: SessionDep,
    _auth: ReadAuth,
    suite: SuiteIdQuery = None,
    status: Annotated[RegressionStatus | None, Query()] = None,
    metric: Annotated[MetricName | None, Query()] = None,
    since: Annotated[
        datetime | None,
        Query(
            description="Changed at or after this time (ISO 8601: a date or a date and time; without an offset, UTC)."
        ),
    ] = None,
    open: Annotated[bool, Query(description="Only open ones (suspected, confirmed, failed; not resolved).")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> RegressionPage:
    if since is not None:
        since = _utc(since)
    rows = db.regressions.list_regressions(
        session,
        suite_id=suite,
        status=status,
        metric=metric,
        since=since,
        open_only=open,
        limit=limit,
        before_id=decode_cursor(cursor),
    )
    page = rows[:limit]
    return RegressionPage(
        items=[regression_read(r) for r in page],  # type: ignore[misc]
        next_cursor=encode_cursor(page[-1].id) if len(rows) > limit else None,
    )


@router.get(
    "/{regression_id}",
    response_model=RegressionDetail,
    responses=PROBLEM_RESPONSES,
    summary="A regression with the environment diff (last good vs first bad run) and its events",
)
def get_regression(regression_id: RegressionId, session: SessionDep, auth: ReaderAuth, response: Response) -> Any:
    response.headers["Vary"] = "Authorization"  # token holders see the hosts of the two runs
    out = regression_read(_get_or_404(session, regression_id), detail=True)
    return out if auth.authenticated() else out | {"env_diff": redact_env_diff(out["env_diff"])}


def redact_env_diff(diff: dict[str, Any] | None) -> dict[str, Any] | None:
    """The env diff as an anonymous reader sees it: without the runs' host names (as redact_run hides them); that
    the hosts changed stays."""
    if not diff:
        return diff
    changes = [c | {"before": [], "after": []} if c.get("key") == "hosts" else c for c in diff.get("changes", [])]
    return diff | {"changes": changes}


@router.get(
    "/{regression_id}/history",
    response_model=RegressionHistory,
    responses=PROBLEM_RESPONSES,
    summary="The point's nightly values of this metric, each with the baseline band it was judged by",
)
def get_history(
    regression_id: RegressionId, session: SessionDep, _auth: ReadAuth, limit: Annotated[int, Query(ge=1, le=365)] = 60
) -> Any:
    row = _get_or_404(session, regression_id)
    config = DEFAULT_METRICS.get(row.metric)
    return {
        "regression_id": row.id,
        "metric": row.metric,
        "higher_is_better": config.higher_is_better if config else True,
        "nights": db.regressions.series_history(session, row, limit),
    }


@router.post(
    "/{regression_id}/acknowledge",
    response_model=RegressionDetail,
    responses=PROBLEM_RESPONSES,
    summary="Acknowledge: someone is on it (the regression stays open and tracked)",
)
def acknowledge(regression_id: RegressionId, session: SessionDep, _auth: WriteAuth) -> Any:
    row = db.regressions.acknowledge(session, _get_or_404(session, regression_id))
    session.commit()
    return regression_read(row, detail=True)


@router.post(
    "/{regression_id}/resolve",
    response_model=RegressionDetail,
    responses=PROBLEM_RESPONSES,
    summary="Resolve by hand: accept the new level; the point's baseline re-forms from later nights",
)
def resolve(regression_id: RegressionId, session: SessionDep, _auth: WriteAuth) -> Any:
    row = db.regressions.resolve(session, _get_or_404(session, regression_id))
    session.commit()
    return regression_read(row, detail=True)
