"""Liveness (the process answers) and readiness (database and broker reachable, naming the failing one)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Request

from api.deps import CeleryDep
from api.problems import PROBLEM_TYPE, FieldError, Problem, ProblemError
from worker.queue import broker_error

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the API process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _database_error(request: Request) -> str | None:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return None
    except Exception as exc:  # noqa: BLE001 - any driver error means "not ready"
        return f"database unreachable: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


@router.get(
    "/readyz",
    summary="Readiness: database and broker reachable",
    responses={
        503: {
            "model": Problem,
            "description": "Not ready; errors name the failing component",
            "content": {PROBLEM_TYPE: {}},
        }
    },
)
def readyz(request: Request, celery: CeleryDep) -> dict[str, str]:
    failures = {"database": _database_error(request), "broker": broker_error(celery)}
    errors = [FieldError(field=name, message=msg) for name, msg in failures.items() if msg]
    if errors:
        raise ProblemError(503, "not ready: " + ", ".join(e.field for e in errors), errors)
    return {"status": "ready", "database": "ok", "broker": "ok"}
