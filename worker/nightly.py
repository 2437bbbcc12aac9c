"""The nightly beat: fire due suites, check finished suite experiments for regressions, send webhooks.

One tick (`nightly_tick`, every NIGHTLY_TICK_S):
1. fire_due_suites: suites whose next_fire_at has come, read from the database each tick (a new or changed
   suite takes effect without a restart). Each is claimed with a compare-and-set on next_fire_at (see
   db/suites.py) in the same transaction that creates its experiment through the normal path (expand,
   store); the runs are published after the commit. Two beat processes fire a suite once.
2. evaluate_finished: suite experiments whose runs have all ended and that were not checked yet
   (detection runs here, from the beat, rather than from the worker that records the last run: a worker
   that dies, a run reaped as lost, or a cancelled run would otherwise leave a night unchecked).
3. worker.webhooks.deliver_due: pending webhook deliveries, with backoff.

Run it: `python -m worker.nightly` (a loop, like `python -m worker.reaper`), or Celery beat with
BEAT_SCHEDULE and a worker consuming NIGHTLY_QUEUE (`celery -A worker.main:app worker -Q scalebench-nightly`).
A missed firing (beat down at 02:00) fires once when the beat is back, then follows the schedule.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from celery import Celery, current_app, shared_task
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.clusters import Cluster
from db import regressions as detect
from db import suites as q
from db.models import Experiment, utcnow
from db.models_nightly import Suite
from worker import webhooks
from worker.dispatch import dispatch_runs

log = logging.getLogger(__name__)
TASK_NIGHTLY_TICK = "scalebench.nightly_tick"
NIGHTLY_QUEUE = "scalebench-nightly"
NIGHTLY_TICK_S = 30.0
BEAT_SCHEDULE = {"scalebench-nightly-tick": {"task": TASK_NIGHTLY_TICK, "schedule": NIGHTLY_TICK_S,
                                             "options": {"queue": NIGHTLY_QUEUE, "expires": NIGHTLY_TICK_S}}}


@dataclass(frozen=True)
class Fired:
    suite_id: int
    experiment_id: int | None
    run_ids: list[int] = field(default_factory=list)
    dispatched: bool = False
    error: str | None = None


def fire_suite(session: Session, celery: Celery | None, suite: Suite, clusters: Mapping[str, Cluster],
               now: datetime) -> Fired:
    """Create the suite's experiment (the caller already holds the claim, or this is a manual trigger),
    commit, then publish its runs. A suite that cannot expand records why on the suite (and commits)."""
    try:
        if suite.cluster not in clusters:
            raise ValueError(f"cluster: {suite.cluster!r} is not configured; allowed: {', '.join(sorted(clusters))}")
        with session.begin_nested():
            exp, run_ids = q.create_suite_experiment(session, suite, clusters[suite.cluster], now)
        q.record_fire_error(session, suite.id, None)
    except ValueError as exc:  # unknown cluster, a matrix with no valid point, an outdated template
        q.record_fire_error(session, suite.id, str(exc)[:2000])
        session.commit()
        log.error("suite %d (%s) not fired: %s", suite.id, suite.name, exc)
        return Fired(suite.id, None, error=str(exc))
    session.commit()
    dispatched = False
    if celery is not None:  # enqueue only after the commit; a down broker leaves them to the dispatcher
        outcome = dispatch_runs(session, celery, run_ids)
        session.commit()
        dispatched = outcome.ok
    log.info("suite %d (%s) fired: experiment %d, %d runs", suite.id, suite.name, exp.id, len(run_ids))
    return Fired(suite.id, exp.id, run_ids, dispatched)


def fire_due_suites(session_factory: sessionmaker[Session], celery: Celery | None,
                    clusters: Mapping[str, Cluster], now: datetime | None = None) -> list[Fired]:
    """Fire every suite due at `now` that this process wins the claim for."""
    now = now or utcnow()
    with session_factory() as s:
        due = q.due_suites(s, now)
    fired = []
    for suite_id, seen in due:
        with session_factory() as s:
            if not q.claim_firing(s, suite_id, seen, now):
                s.rollback()
                log.info("suite %d: claimed by another beat", suite_id)
                continue
            suite = s.get(Suite, suite_id)
            assert suite is not None
            fired.append(fire_suite(s, celery, suite, clusters, now))
    return fired


def evaluate_finished(session_factory: sessionmaker[Session], now: datetime | None = None) -> list[int]:
    """Check every finished, unchecked suite experiment (oldest first). Returns the experiment ids checked.

    A night that finishes after a later night of its suite was checked is recorded as checked without
    findings (the state machine only moves forward in time)."""
    now = now or utcnow()
    with session_factory() as s:
        pending = detect.pending_evaluations(s)
    done = []
    for exp_id, suite_id, finished in pending:
        if not finished:
            continue
        with session_factory() as s:
            try:
                created = s.get(Experiment, exp_id).created_at  # type: ignore[union-attr]
                latest = detect.latest_evaluated_at(s, suite_id)
                if latest is not None and created < latest:
                    detect.mark_skipped(s, exp_id, suite_id, now)
                    log.warning("suite %d: experiment %d finished after a later night was checked: skipped",
                                suite_id, exp_id)
                else:
                    rows = detect.detect_for_experiment(s, exp_id, now)
                    for r in rows:
                        log.warning("suite %d experiment %d: %s", suite_id, exp_id, r.message)
                s.commit()
            except IntegrityError:  # another beat checked it first
                s.rollback()
                continue
        done.append(exp_id)
    return done


def nightly_tick(session_factory: sessionmaker[Session], celery: Celery | None, clusters: Mapping[str, Cluster],
                 now: datetime | None = None) -> dict[str, list]:
    """One tick; a failing phase is logged and does not stop the others."""
    now = now or utcnow()
    out: dict[str, list] = {"fired": [], "evaluated": [], "deliveries": []}
    phases = (("fired", lambda: fire_due_suites(session_factory, celery, clusters, now)),
              ("evaluated", lambda: evaluate_finished(session_factory, now)),
              ("deliveries", lambda: webhooks.deliver_due(session_factory, now)))
    for name, phase in phases:
        try:
            out[name] = phase()
        except Exception:  # noqa: BLE001 - logged with its traceback; the next tick retries
            log.exception("nightly tick: %s failed", name)
    return out


@shared_task(name=TASK_NIGHTLY_TICK, acks_late=False, ignore_result=True)
def nightly_tick_task() -> dict[str, int]:
    from worker.runtime import get_runtime

    rt = get_runtime()
    out = nightly_tick(rt.session_factory, current_app, rt.clusters)
    return {k: len(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="scalebench nightly beat: fire suites, detect regressions, webhooks")
    parser.add_argument("--interval-s", type=float, default=NIGHTLY_TICK_S)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from worker.celery_app import make_celery
    from worker.runtime import get_runtime

    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    rt = get_runtime()
    celery = make_celery(rt.settings)
    log.info("nightly beat: tick every %.0f s", args.interval_s)
    while not stop:
        nightly_tick(rt.session_factory, celery, rt.clusters)
        if args.once:
            break
        time.sleep(args.interval_s)


if __name__ == "__main__":
    main()
