"""The beat's firing logic with a controlled clock, on the real PostgreSQL and Redis: due suites fire once
through the normal creation path (runs queued, published after commit), never twice with two beats."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from core.contracts.clusters import LOCAL_CPU
from db.models import Experiment, Run, Suite
from db.suites import update_suite
from tests.db.nights import make_suite
from worker.nightly import fire_due_suites

CLUSTERS = {"local-cpu": LOCAL_CPU}
DAY1 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


def experiments(session):
    return list(session.scalars(sa.select(Experiment).order_by(Experiment.id)))


def test_fires_when_due_once_per_slot_and_follows_the_schedule(pg_session_factory, celery_app, queued_messages):
    with pg_session_factory() as s:
        # default '0 2 * * *'; its runs never run here, so the policy that fires anyway (test_concurrency.py)
        suite = make_suite(s, now=DAY1, concurrency_policy="queue")
        assert suite.next_fire_at == DAY1.replace(hour=2)

    assert fire_due_suites(pg_session_factory, celery_app, CLUSTERS, DAY1 + timedelta(minutes=59)) == []
    [fired] = fire_due_suites(pg_session_factory, celery_app, CLUSTERS, DAY1 + timedelta(hours=1, seconds=10))
    assert fired.experiment_id is not None and len(fired.run_ids) == 4 and fired.dispatched
    assert sorted(args[0] for _, args in queued_messages("local-cpu")) == sorted(fired.run_ids)
    assert fire_due_suites(pg_session_factory, celery_app, CLUSTERS, DAY1 + timedelta(hours=1, seconds=40)) == []

    with pg_session_factory() as s:
        [exp] = experiments(s)
        assert (exp.source, exp.suite_id, exp.cluster) == ("suite", suite.id, "local-cpu")
        assert "suite:nightly-debug" in exp.tags
        assert {r.status for r in s.scalars(sa.select(Run))} == {"queued"}
        row = s.get(Suite, suite.id)
        assert row.last_fired_at == DAY1 + timedelta(hours=1, seconds=10)
        assert row.next_fire_at == datetime(2026, 12, 3, 2, 0, tzinfo=UTC)

    # the beat was down for two nights: one firing when it is back, then the schedule again
    [late] = fire_due_suites(pg_session_factory, celery_app, CLUSTERS, datetime(2026, 12, 5, 9, 0, tzinfo=UTC))
    assert late.experiment_id is not None
    with pg_session_factory() as s:
        assert len(experiments(s)) == 2
        assert s.get(Suite, suite.id).next_fire_at == datetime(2026, 12, 6, 2, 0, tzinfo=UTC)


def test_new_disabled_and_rescheduled_suites_take_effect_without_a_restart(pg_session_factory):
    now = DAY1
    assert fire_due_suites(pg_session_factory, None, CLUSTERS, now) == []
    with pg_session_factory() as s:
        a = make_suite(s, name="a", now=now, schedule="*/10 * * * *")
        b = make_suite(s, name="b", now=now, schedule="*/10 * * * *", enabled=False)
        assert b.next_fire_at is None
    fired = fire_due_suites(pg_session_factory, None, CLUSTERS, now + timedelta(minutes=10))
    assert [f.suite_id for f in fired] == [a.id]
    with pg_session_factory() as s:
        update_suite(s, s.get(Suite, a.id), enabled=False, now=now + timedelta(minutes=11))
        update_suite(s, s.get(Suite, b.id), enabled=True, schedule="0 * * * *", now=now + timedelta(minutes=11))
        s.commit()
    assert fire_due_suites(pg_session_factory, None, CLUSTERS, now + timedelta(minutes=59)) == []
    fired = fire_due_suites(pg_session_factory, None, CLUSTERS, now + timedelta(minutes=60))
    assert [f.suite_id for f in fired] == [b.id]


def test_a_suite_that_cannot_fire_says_why_and_waits_for_its_next_slot(pg_session_factory):
    with pg_session_factory() as s:
        suite = make_suite(s, now=DAY1)
        s.execute(sa.update(Suite).values(cluster="gone"))
        s.commit()
    [fired] = fire_due_suites(pg_session_factory, None, CLUSTERS, DAY1 + timedelta(hours=1))
    assert fired.experiment_id is None and "cluster: 'gone' is not configured" in fired.error
    with pg_session_factory() as s:
        row = s.get(Suite, suite.id)
        assert "allowed: local-cpu" in row.last_error and row.next_fire_at == datetime(2026, 12, 3, 2, 0, tzinfo=UTC)
        assert experiments(s) == []


def test_two_beat_processes_fire_each_due_suite_once(pg_session_factory, celery_app, queued_messages):
    num_suites = 8
    with pg_session_factory() as s:
        ids = [make_suite(s, name=f"s{i}", now=DAY1).id for i in range(num_suites)]
    now = DAY1 + timedelta(hours=1)
    barrier = threading.Barrier(2)
    results: list[list] = [[], []]

    def beat(i: int) -> None:
        barrier.wait()  # both read the same due list, then race for every claim
        results[i] = fire_due_suites(pg_session_factory, celery_app, CLUSTERS, now)

    threads = [threading.Thread(target=beat, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    fired = [f.suite_id for r in results for f in r]
    assert sorted(fired) == ids  # every suite once, whichever beat won it
    with pg_session_factory() as s:
        assert sorted(e.suite_id for e in experiments(s)) == ids
    assert len(queued_messages("local-cpu")) == 4 * num_suites  # every run published once


def test_claim_works_on_sqlite_too(sqlite_url):
    from db.session import make_engine, make_session_factory

    engine = make_engine(sqlite_url)
    factory = make_session_factory(engine)
    try:
        with factory() as s:
            suite = make_suite(s, now=DAY1)
        due_at = DAY1 + timedelta(hours=1)
        with factory() as s:  # a second beat read the due suite before the first fired it
            from db.suites import claim_firing, due_suites

            [(suite_id, seen)] = due_suites(s, due_at)
        [fired] = fire_due_suites(factory, None, CLUSTERS, due_at)
        with factory() as s:
            assert not claim_firing(s, suite_id, seen, due_at)  # the stale compare-and-set changes nothing
            assert len(experiments(s)) == 1 and s.get(Suite, suite.id).next_fire_at > due_at
        assert fired.experiment_id is not None
    finally:
        engine.dispose()


def test_beat_entry_point_fires_from_a_separate_process(
    pg_session_factory, pg_url, redis_url, tmp_path, queued_messages
):
    import os
    import subprocess
    import sys

    with pg_session_factory() as s:
        make_suite(s, now=DAY1)  # due since DAY1 02:00, in the real clock's past
    env = os.environ | {
        "SCALEBENCH_DATABASE_URL": pg_url,
        "SCALEBENCH_BROKER_URL": redis_url,
        "SCALEBENCH_DATA_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "worker.scheduler", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    with pg_session_factory() as s:
        [exp] = experiments(s)
    assert len(queued_messages("local-cpu")) == 4 and exp.source == "suite"
