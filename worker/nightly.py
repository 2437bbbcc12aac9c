"""The nightly beat: fire due suites, check finished suite experiments for regressions, send webhooks.

One tick (`nightly_tick`, every NIGHTLY_TICK_S):
1. fire_due_suites: suites whose next_fire_at has come, read from the database each tick (a new or changed
   suite takes effect without a restart). Each is claimed with a compare-and-set on next_fire_at (see
   db/suites.py) in the same transaction that creates its experiment through the normal path (expand,
   store); the runs are published after the commit. Two beat processes fire a suite once. The suite's
   concurrency policy (skip, queue, replace) and its queued-run cap decide whether a firing whose earlier
   firings have unfinished runs creates an experiment; a skipped firing is recorded with its reason.
2. evaluate_finished: suite experiments whose runs have all ended and that were not checked yet
   (detection runs here, from the beat, rather than from the worker that records the last run: a worker
   that dies, a run reaped as lost, or a cancelled run would otherwise leave a night unchecked).
3. worker.webhooks.deliver_due: pending webhook deliveries, with backoff.

The scheduler process (worker.scheduler) runs the tick. A missed firing (scheduler down at 02:00) fires
once when the scheduler is back, then follows the schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from celery import Celery
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

import db.detection
import db.suites
from core.contracts.clusters import Cluster
from db.base import utcnow
from db.experiments import get_experiment
from db.models import Suite
from db.suites import Fired
from worker import webhooks
from worker.queue import dispatch_runs

log = logging.getLogger(__name__)
NIGHTLY_TICK_S = 30.0


def fire_and_publish(
    session: Session, celery: Celery | None, suite: Suite, clusters: Mapping[str, Cluster], now: datetime
) -> Fired:
    """db.suites.fire_suite, commit, then publish its runs (a down broker leaves them to the dispatcher)."""
    fired = db.suites.fire_suite(session, suite, clusters, now)
    session.commit()
    if fired.skipped is not None:
        log.warning("suite %d (%s) firing skipped: %s", suite.id, suite.name, fired.skipped)
        return fired
    if fired.experiment_id is None:
        log.error("suite %d (%s) not fired: %s", suite.id, suite.name, fired.error)
        return fired
    dispatched = False
    if celery is not None:
        dispatched = dispatch_runs(session, celery, fired.run_ids).ok
        session.commit()
    log.info(
        "suite %d (%s) fired: experiment %d, %d runs", suite.id, suite.name, fired.experiment_id, len(fired.run_ids)
    )
    return replace(fired, dispatched=dispatched)


def fire_due_suites(
    session_factory: sessionmaker[Session],
    celery: Celery | None,
    clusters: Mapping[str, Cluster],
    now: datetime | None = None,
) -> list[Fired]:
    """Fire every suite due at `now` that this process wins the claim for."""
    now = now or utcnow()
    with session_factory() as s:
        due = db.suites.due_suites(s, now)
    fired = []
    for suite_id, seen in due:
        with session_factory() as s:
            if not db.suites.claim_firing(s, suite_id, seen, now):
                s.rollback()
                log.info("suite %d: claimed by another beat", suite_id)
                continue
            suite = db.suites.get_suite(s, suite_id)
            assert suite is not None
            fired.append(fire_and_publish(s, celery, suite, clusters, now))
    return fired


def evaluate_finished(session_factory: sessionmaker[Session], now: datetime | None = None) -> list[int]:
    """Check every finished, unchecked suite experiment (oldest first). Returns the experiment ids checked.

    A night that finishes after a later night of its suite was checked is recorded as checked without
    findings (the state machine only moves forward in time)."""
    now = now or utcnow()
    with session_factory() as s:
        pending = db.detection.pending_evaluations(s)
    done = []
    for exp_id, suite_id, finished in pending:
        if not finished:
            continue
        with session_factory() as s:
            try:
                created = get_experiment(s, exp_id).created_at  # type: ignore[union-attr]
                latest = db.detection.latest_evaluated_at(s, suite_id)
                if latest is not None and created < latest:
                    db.detection.mark_skipped(s, exp_id, suite_id, now)
                    log.warning(
                        "suite %d: experiment %d finished after a later night was checked: skipped", suite_id, exp_id
                    )
                else:
                    rows = db.detection.detect_for_experiment(s, exp_id, now)
                    for r in rows:
                        log.warning("suite %d experiment %d: %s", suite_id, exp_id, r.message)
                s.commit()
            except IntegrityError:  # another beat checked it first
                s.rollback()
                continue
        done.append(exp_id)
    return done


def nightly_tick(
    session_factory: sessionmaker[Session],
    celery: Celery | None,
    clusters: Mapping[str, Cluster],
    now: datetime | None = None,
    *,
    webhook_allow_private: bool = False,
    deliver_webhooks: bool = True,
) -> dict[str, list]:
    """One tick; a failing phase is logged and does not stop the others. webhook_allow_private: the operator
    allows webhook receivers on private networks (settings.webhook_allow_private). deliver_webhooks=False: the
    caller delivers them elsewhere (the scheduler's own sender thread, worker.webhooks.WebhookSender)."""
    now = now or utcnow()
    out: dict[str, list] = {"fired": [], "evaluated": [], "deliveries": []}
    phases: list[tuple[str, Callable[[], list[Any]]]] = [
        ("fired", lambda: fire_due_suites(session_factory, celery, clusters, now)),
        ("evaluated", lambda: evaluate_finished(session_factory, now)),
    ]
    if deliver_webhooks:
        phases.append(
            ("deliveries", lambda: webhooks.deliver_due(session_factory, now, allow_private=webhook_allow_private))
        )
    for name, phase in phases:
        try:
            out[name] = phase()
        except Exception:  # noqa: BLE001 - logged with its traceback; the next tick retries
            log.exception("nightly tick: %s failed", name)
    return out
