"""The queue: the Celery app factory (no app is created at import), publishing runs after commit, and the
broker probe. This is the one module of worker/ that the API imports (publish, ping); it imports no task.

Redis in production; kombu's filesystem transport for the embedded default (`filesystem://` broker URL, no
server needed, remote control included).

Delivery semantics: acks_late + prefetch 1, so a message is acknowledged only after its task returned,
and a worker holds one message at a time. The visibility timeout is longer than the longest run, so Redis
does not hand a still-running message to a second worker; a redelivered message finds its run claimed
(db.runs.claim_run is atomic) and exits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.orm import Session, sessionmaker

from core.settings import Settings
from db import outbox
from db.base import utcnow
from osutil.private import private_dir

log = logging.getLogger(__name__)

TASK_EXECUTE_RUN = "scalebench.execute_run"
DEFAULT_QUEUE = "local-cpu"
MAX_RUN_S = 7 * 24 * 3600  # ExperimentSpec.timeout_s upper bound
VISIBILITY_TIMEOUT_S = MAX_RUN_S + 6 * 3600  # longest run + margin for queueing on Slurm and cleanup
FILESYSTEM_POLL_S = 0.2  # how often a worker on the filesystem broker looks for a message
TASK_SOFT_TIME_LIMIT_S = MAX_RUN_S + 3600  # the launcher enforces the run's own timeout_s first
TASK_TIME_LIMIT_S = MAX_RUN_S + 2 * 3600
BROKER_CONNECT_TIMEOUT_S = 3.0  # a down broker must fail a publish fast (the dispatcher retries later)
DISPATCH_BATCH = 500


def filesystem_broker_dirs(settings: Settings) -> dict[str, Path]:
    """Folders of the filesystem transport: the URL's path if it has one, else <data_dir>/broker."""
    path = settings.broker_url.removeprefix("filesystem://").strip()
    root = Path(path) if path not in ("", "/") else settings.data_dir / "broker"
    return {"queue": root / "queue", "control": root / "control", "processed": root / "processed"}


def _transport(settings: Settings) -> tuple[str, dict]:
    if settings.broker_is_filesystem:
        dirs = filesystem_broker_dirs(settings)
        private_dir(dirs["queue"].parent)  # queued task bodies: its owner's only (osutil.private)
        for d in dirs.values():
            private_dir(d)
        # Producers write and consumers read the same folder; control_folder enables fanout (remote control).
        return "filesystem://", {
            "data_folder_in": str(dirs["queue"]),
            "data_folder_out": str(dirs["queue"]),
            "control_folder": str(dirs["control"]),
            "processed_folder": str(dirs["processed"]),
            "store_processed": False,
            "visibility_timeout": VISIBILITY_TIMEOUT_S,
            # kombu polls the folder once a second by default: up to a second idle between two runs
            "polling_interval": FILESYSTEM_POLL_S,
        }
    return settings.broker_url, {
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
    }


def make_celery(settings: Settings | None = None, include: Sequence[str] = ()) -> Celery:
    """A configured Celery app for `settings` (default: from the environment). `include`: task modules."""
    settings = settings or Settings.from_env()
    broker_url, transport_options = _transport(settings)
    app = Celery("scalebench", broker=broker_url, include=list(include))
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # outcomes live in the database, not in a result backend
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=DEFAULT_QUEUE,
        task_soft_time_limit=TASK_SOFT_TIME_LIMIT_S,
        task_time_limit=TASK_TIME_LIMIT_S,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=BROKER_CONNECT_TIMEOUT_S,
        worker_hijack_root_logger=False,
        timezone="UTC",
        enable_utc=True,
    )
    app.conf.scalebench_broker_url = settings.broker_url
    if not settings.broker_is_filesystem:
        # One probe client per app: no retries, short timeouts (redis-py retries for ~6 s by default).
        app.conf.scalebench_probe = redis.Redis.from_url(
            settings.broker_url,
            socket_connect_timeout=BROKER_CONNECT_TIMEOUT_S / 3,
            socket_timeout=BROKER_CONNECT_TIMEOUT_S / 3,
            retry=Retry(NoBackoff(), 0),
        )
    return app


def broker_error(app: Celery) -> str | None:
    """None when the broker answers now, else why not (fast: no retries). Used by publishers and /readyz."""
    url = app.conf.get("scalebench_broker_url") or app.conf.broker_url
    try:
        if str(url).startswith("filesystem://"):
            folder = Path(app.conf.broker_transport_options["data_folder_out"])
            if not folder.is_dir():
                return f"broker folder {str(folder)!r} does not exist"
            return None
        app.conf.scalebench_probe.ping()
        return None
    except Exception as exc:  # noqa: BLE001 - redis raises ConnectionError, TimeoutError, AuthenticationError, ...
        return f"broker {_redact(str(url))} unreachable: {type(exc).__name__}: {exc}"


def _redact(url: str) -> str:
    """The URL without a password (it goes into API responses)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


@dataclass(frozen=True)
class DispatchOutcome:
    published: list[int]
    error: str | None = None  # why publishing stopped (broker down), when it did

    @property
    def ok(self) -> bool:
        return self.error is None


def publish_run(celery: Celery, run_id: int, queue: str, producer=None) -> None:
    """One message per run, by task name, on the cluster's queue. Raises when the broker refuses it."""
    celery.send_task(TASK_EXECUTE_RUN, args=[run_id], queue=queue, retry=False, producer=producer)


def dispatch_runs(
    session: Session, celery: Celery, run_ids: Sequence[int] | None = None, limit: int = DISPATCH_BATCH
) -> DispatchOutcome:
    """Publish undispatched queued runs (those of `run_ids`, or any) and stamp dispatched_at.

    All or nothing per call: on a broker error nothing is stamped. The caller commits (that releases
    the row locks).
    """
    error = broker_error(celery)  # fail fast: a refused publish would block a request for seconds
    if error:
        return DispatchOutcome([], error)
    return _publish_locked(session, celery, outbox.lock_undispatched(session, run_ids, limit))


def _publish_locked(session: Session, celery: Celery, rows: list[tuple[int, str]]) -> DispatchOutcome:
    """Publish one message per locked (run id, queue) row, then stamp them; nothing is stamped on an error."""
    if not rows:
        return DispatchOutcome([])
    try:
        # One pipelined round trip on Redis (kombu >= 5.6 batches); other transports publish one by one.
        with celery.producer_or_acquire() as producer, producer.batch():
            for run_id, queue in rows:
                publish_run(celery, run_id, queue, producer=producer)
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise several types for "broker unreachable"
        # A failed batch is all-or-nothing for us: none is stamped, so the dispatcher sends them again
        # (a message that did get through is then a duplicate the worker's atomic claim ignores).
        error = f"broker unreachable: {type(exc).__name__}: {exc}"
        log.warning("publishing %d runs failed; %s", len(rows), error)
        return DispatchOutcome([], error)
    return DispatchOutcome(outbox.stamp_dispatched(session, [run_id for run_id, _ in rows]))


def dispatch_pending(
    session_factory: sessionmaker[Session], celery: Celery, limit: int = DISPATCH_BATCH
) -> DispatchOutcome:
    """One pass of the scheduler's dispatcher: re-publish queued runs whose dispatched_at is NULL."""
    with session_factory() as session:
        outcome = dispatch_runs(session, celery, None, limit)
        session.commit()
    if outcome.published:
        log.info("dispatcher published %d runs", len(outcome.published))
    return outcome


def redispatch_stale(
    session_factory: sessionmaker[Session], celery: Celery, after_s: float, limit: int = DISPATCH_BATCH
) -> DispatchOutcome:
    """Publish again queued runs whose latest message is older than `after_s` and that no worker claimed:
    the broker may have lost it (a Redis without an append-only file restarted). The stamp resets
    dispatched_at, so a run is published again at most once per `after_s`; a message that was not lost
    after all is a duplicate, and a duplicate claims the oldest claimable run of its cluster or nothing."""
    error = broker_error(celery)
    if error:
        return DispatchOutcome([], error)
    with session_factory() as session:
        rows = outbox.lock_stale_dispatched(session, utcnow() - timedelta(seconds=after_s), limit)
        outcome = _publish_locked(session, celery, rows)
        session.commit()
    if outcome.published:
        log.warning(
            "re-published %d runs queued for more than %.0f s since their last message (lost by the broker?): %s",
            len(outcome.published),
            after_s,
            outcome.published,
        )
    return outcome
