"""The FastAPI app factory. Nothing is created at import: engine, sessions, the Celery publisher and the
clusters live in the lifespan. Runs a down broker left unpublished are re-published by the scheduler
(worker.scheduler), not by the API.

Run it: `uvicorn api.app:create_app --factory`. Routers: add one line to ROUTERS.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI

from api.caches import make_caches
from api.problems import install_problem_handlers
from api.routers import (
    analysis,
    breakdown,
    clusters,
    dashboard,
    experiments,
    health,
    imports,
    metrics,
    projection,
    regressions,
    runs,
    suites,
    tokens,
    webhooks,
)
from core.contracts.clusters import load_clusters
from core.settings import Settings
from db.session import make_engine, make_session_factory
from worker.queue import make_celery

log = logging.getLogger(__name__)

ROUTERS: list[APIRouter] = [
    experiments.router,
    runs.router,
    clusters.router,
    health.router,
    imports.router,
    analysis.router,
    breakdown.router,
    dashboard.router,
    suites.router,
    regressions.router,
    webhooks.router,
    metrics.router,
    projection.router,
    tokens.router,
]

DESCRIPTION = """\
scalebench measures how FP8 training throughput scales with GPU count.

POST an experiment (a model, GPU counts, precisions, parallelism layouts); the service expands the matrix
into runs, queues them on the cluster's workers, stores every result, and answers with scaling curves.
Writes need `Authorization: Bearer <token>` (`scalebench token create`; list and revoke tokens with
`scalebench token list` / `revoke`, or GET/POST/DELETE /tokens); they are rate-limited per token (429 with
Retry-After) and their bodies are JSON (415 otherwise) of bounded size (413). Errors are
`application/problem+json` (RFC 9457) with `errors: [{field, message, allowed}]`.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for `settings` (default: from the environment)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings or Settings.from_env()
        engine = make_engine(s.database_url)
        app.state.settings, app.state.engine = s, engine
        app.state.session_factory = make_session_factory(engine)
        # Same pool; connections check out in autocommit for GET/HEAD (see api.deps.get_session).
        app.state.read_session_factory = make_session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))
        app.state.celery = make_celery(s)
        app.state.clusters = load_clusters(s.clusters_file)
        app.state.caches = make_caches(s)
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(title="scalebench", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    install_problem_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app
