"""GET /metrics: Prometheus text computed from the database on every scrape (a custom collector).

The database is the source of truth: any API replica answers the same numbers, and nothing is lost when
a process restarts. Histograms are aggregated in SQL (one statement each), so a scrape costs a few
indexed queries whatever the number of runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from api.deps import ReadAuth
from db.base import utcnow
from db.models import ACTIVE_STATUSES, RUN_STATUSES, Run

router = APIRouter(tags=["metrics"])

# Seconds. Run durations span a CPU smoke test to a multi-day pretraining benchmark.
RUN_DURATION_BUCKETS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 48 * 3600)
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800)


def _seconds_between(dialect: str, start: Any, end: Any) -> sa.ColumnElement[Any]:
    if dialect == "sqlite":
        return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0
    return sa.func.extract("epoch", end - start)


class DbCollector(Collector):
    def __init__(self, session_factory: sessionmaker[Session]):
        self.session_factory = session_factory

    def collect(self) -> Iterator[Any]:
        with self.session_factory() as session:
            dialect = session.get_bind().dialect.name
            yield self._runs(session)
            yield self._queue_depth(session)
            yield self._oldest_queued(session)
            yield self._expired_leases(session)
            yield self._histogram(
                session,
                dialect,
                "scalebench_run_duration_seconds",
                "Wall time of ended runs, started_at to finished_at.",
                Run.started_at,
                Run.finished_at,
                RUN_DURATION_BUCKETS_S,
                ["cluster", "status"],
                [Run.cluster, Run.status],
                Run.status.in_(("succeeded", "failed", "cancelled")),
            )
            yield self._histogram(
                session,
                dialect,
                "scalebench_dispatch_latency_seconds",
                "Created (API commit) to published on the broker.",
                Run.created_at,
                Run.dispatched_at,
                LATENCY_BUCKETS_S,
                ["cluster"],
                [Run.cluster],
                sa.true(),
            )
            yield self._histogram(
                session,
                dialect,
                "scalebench_queue_wait_seconds",
                "Created to claimed by a worker (started_at of the last attempt).",
                Run.created_at,
                Run.started_at,
                LATENCY_BUCKETS_S,
                ["cluster"],
                [Run.cluster],
                sa.true(),
            )

    def _runs(self, session: Session) -> GaugeMetricFamily:
        g = GaugeMetricFamily("scalebench_runs", "Runs by status and cluster.", labels=["status", "cluster"])
        counts = {
            (s, c): n
            for s, c, n in session.execute(
                sa.select(Run.status, Run.cluster, sa.func.count()).group_by(Run.status, Run.cluster)
            )
        }
        for cluster in sorted({c for _s, c in counts}):
            for status in RUN_STATUSES:  # every status, zeros included, so that rates and alerts see them
                g.add_metric([status, cluster], counts.get((status, cluster), 0))
        return g

    def _queue_depth(self, session: Session) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "scalebench_queue_depth",
            "Queued runs by cluster: undispatched (not yet on the broker) and dispatched.",
            labels=["cluster", "state"],
        )
        dispatched = sa.case((Run.dispatched_at.is_(None), "undispatched"), else_="dispatched")
        rows = session.execute(
            sa.select(Run.cluster, dispatched, sa.func.count())
            .where(Run.status == "queued")
            .group_by(Run.cluster, dispatched)
        )
        for cluster, state, n in rows:
            g.add_metric([cluster, state], n)
        return g

    def _oldest_queued(self, session: Session) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "scalebench_oldest_queued_run_age_seconds", "Age of the oldest queued run.", labels=["cluster"]
        )
        now = utcnow()
        for cluster, oldest in session.execute(
            sa.select(Run.cluster, sa.func.min(Run.created_at)).where(Run.status == "queued").group_by(Run.cluster)
        ):
            if oldest is not None:  # func.min keeps the column type: an aware UTC datetime
                g.add_metric([cluster], max(0.0, (now - oldest).total_seconds()))
        return g

    def _expired_leases(self, session: Session) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "scalebench_runs_lease_expired",
            "Active runs whose worker stopped heartbeating (the reaper requeues or fails them).",
        )
        g.add_metric(
            [],
            session.scalar(
                sa.select(sa.func.count()).where(Run.status.in_(ACTIVE_STATUSES), Run.lease_expires_at < utcnow())
            )
            or 0,
        )
        return g

    def _histogram(
        self,
        session: Session,
        dialect: str,
        name: str,
        doc: str,
        start: Any,
        end: Any,
        buckets: tuple[float, ...],
        labels: list[str],
        columns: list[Any],
        where: Any,
    ) -> HistogramMetricFamily:
        seconds = _seconds_between(dialect, start, end)
        cumulative = [sa.func.sum(sa.case((seconds <= b, 1), else_=0)) for b in buckets]
        stmt = (
            sa.select(*columns, sa.func.count(), sa.func.sum(seconds), *cumulative)
            .where(where, start.is_not(None), end.is_not(None))
            .group_by(*columns)
        )
        h = HistogramMetricFamily(name, doc, labels=labels)
        for row in session.execute(stmt):
            values, count, total = list(row[: len(columns)]), int(row[len(columns)]), float(row[len(columns) + 1] or 0)
            le = [(str(float(b)), int(n or 0)) for b, n in zip(buckets, row[len(columns) + 2 :])]
            h.add_metric(values, le + [("+Inf", count)], total)
        return h


def _registry(request: Request) -> CollectorRegistry:
    registry = getattr(request.app.state, "metrics_registry", None)
    if registry is None:  # one per app (its own session factory), built on the first scrape
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DbCollector(request.app.state.session_factory))
        request.app.state.metrics_registry = registry
    return registry


@router.get(
    "/metrics",
    summary="Prometheus metrics: runs by status and cluster, queue depth, durations",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
def metrics(request: Request, _auth: ReadAuth) -> Response:
    return Response(generate_latest(_registry(request)), media_type=CONTENT_TYPE_LATEST)
