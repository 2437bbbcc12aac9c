"""A suite cannot pile up runs: on `* * * * *` with runs that take longer than a minute, the concurrency policy
decides what a firing does while earlier firings have unfinished runs (skip: the default, recorded with its
reason; queue; replace: cancel, then fire), and the queued-run cap bounds what a suite can have waiting,
whatever the policy and for manual triggers too. Real PostgreSQL (and the migrated SQLite file for the schema);
a controlled clock drives the beat minute by minute.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import db.runs
from core.contracts.clusters import LOCAL_CPU
from db.models import Run, SuiteFiring
from db.session import make_engine, make_session_factory
from db.suites import list_firings, update_suite
from tests.db.nights import make_suite
from worker.nightly import fire_due_suites

CLUSTERS = {"local-cpu": LOCAL_CPU}
T = datetime(2026, 12, 4, 10, 0, 30, tzinfo=UTC)
RUNS_PER_FIRING = 4


def _minutes(factory, n: int, start: int = 0):
    """The beat ticking once a minute for n minutes: what each firing did."""
    out = []
    for m in range(start, start + n):
        out += fire_due_suites(factory, None, CLUSTERS, T + timedelta(minutes=m + 1))
    return out


def _runs(factory) -> dict[str, int]:
    with factory() as s:
        return dict(s.execute(sa.select(Run.status, sa.func.count()).group_by(Run.status)).all())


def test_skip_is_the_default_and_records_why(pg_session_factory) -> None:
    with pg_session_factory() as s:
        suite = make_suite(s, now=T, schedule="* * * * *")
        assert suite.concurrency_policy == "skip"
    fired = _minutes(pg_session_factory, 10)
    assert [f.experiment_id is not None for f in fired] == [True] + [False] * 9
    assert all(f.skipped and "concurrency_policy skip" in f.skipped for f in fired[1:])
    assert _runs(pg_session_factory) == {"queued": RUNS_PER_FIRING}  # ten minutes, one firing's runs
    with pg_session_factory() as s:
        firings = list_firings(s, suite.id)
        assert [f.outcome for f in firings] == ["skipped"] * 9 + ["fired"]
        assert "4 unfinished runs (4 queued, 0 running)" in firings[0].reason and firings[0].trigger == "schedule"
        # the first firing's runs end (one runs, then everything finishes): the next minute fires again
        ids = [r for (r,) in s.execute(sa.select(Run.id))]
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        s.commit()
    [still] = _minutes(pg_session_factory, 1, start=10)
    assert "(3 queued, 1 running)" in still.skipped
    with pg_session_factory() as s:
        s.execute(sa.update(Run).values(status="succeeded"))
        s.commit()
    [again] = _minutes(pg_session_factory, 1, start=11)
    assert again.experiment_id is not None


def test_queue_fires_every_time_up_to_the_cap(pg_session_factory) -> None:
    with pg_session_factory() as s:
        suite = make_suite(s, now=T, schedule="* * * * *", concurrency_policy="queue", max_queued_runs=10)
    fired = _minutes(pg_session_factory, 6)
    # 0, 4, 8 runs queued before the first three firings; at 12 >= 10 every later one is skipped
    assert [f.experiment_id is not None for f in fired] == [True, True, True, False, False, False]
    assert "max_queued_runs: 12 runs of earlier firings are still queued (the cap is 10)" in fired[3].skipped
    assert _runs(pg_session_factory) == {"queued": 12}
    with pg_session_factory() as s:
        assert [f.outcome for f in list_firings(s, suite.id)] == ["skipped"] * 3 + ["fired"] * 3


def test_replace_cancels_the_earlier_firings_runs_and_fires(pg_session_factory) -> None:
    with pg_session_factory() as s:
        suite = make_suite(s, now=T, schedule="* * * * *", concurrency_policy="replace")
    [first] = _minutes(pg_session_factory, 1)
    with pg_session_factory() as s:
        assert db.runs.claim_run(s, first.run_ids[0], "w", "h", 30)  # one of them is running
        s.commit()
    [second] = _minutes(pg_session_factory, 1, start=1)
    assert second.experiment_id is not None and second.num_cancelled == RUNS_PER_FIRING
    with pg_session_factory() as s:
        old = {r.id: r for r in s.scalars(sa.select(Run).where(Run.id.in_(first.run_ids)))}
        running = old[first.run_ids[0]]
        assert (running.status, running.cancel_requested) == ("running", True)  # its worker stops it
        assert {old[i].status for i in first.run_ids[1:]} == {"cancelled"}
        assert "replaced by a newer firing" in old[first.run_ids[1]].error_message
        [latest, _] = list_firings(s, suite.id)
        assert (latest.outcome, latest.num_cancelled) == ("fired", RUNS_PER_FIRING)
        assert latest.reason.startswith("replaced earlier firings: 4 runs")
    assert _runs(pg_session_factory) == {"queued": RUNS_PER_FIRING, "running": 1, "cancelled": 3}


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    policy=st.sampled_from(["skip", "queue", "replace"]),
    cap=st.integers(1, 20),
    minutes=st.integers(1, 30),
    finish_every=st.integers(2, 10),
)
def test_queued_runs_stay_bounded_whatever_the_policy(pg_session_factory, policy, cap, minutes, finish_every) -> None:
    """A minutely suite whose runs finish only every few minutes: the suite never holds more queued runs than
    its cap plus one firing, and every firing is recorded (fired or skipped with a reason)."""
    with pg_session_factory() as s:
        s.execute(sa.delete(SuiteFiring))
        s.execute(sa.text("TRUNCATE experiments, suites RESTART IDENTITY CASCADE"))
        s.commit()
        suite = make_suite(s, now=T, schedule="* * * * *", concurrency_policy=policy, max_queued_runs=cap)
    for m in range(minutes):
        _minutes(pg_session_factory, 1, start=m)
        queued = _runs(pg_session_factory).get("queued", 0)
        assert queued < cap + RUNS_PER_FIRING, (policy, cap, m, queued)
        if m % finish_every == finish_every - 1:
            with pg_session_factory() as s:
                s.execute(sa.update(Run).where(Run.status == "queued").values(status="succeeded"))
                s.commit()
    with pg_session_factory() as s:
        firings = list_firings(s, suite.id, limit=1000)
        assert len(firings) == minutes
        assert all(f.outcome == "fired" or (f.outcome == "skipped" and f.reason) for f in firings)


def test_the_api_takes_and_shows_the_policy_and_the_firings(client) -> None:
    spec = {"name": "s", "model": "debug", "gpu_counts": [1, 2], "precisions": ["bf16"], "steps": 4, "warmup_steps": 1}
    bad = client.post("/suites", json={"name": "a", "spec": spec, "concurrency_policy": "forbid"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "concurrency_policy"
    assert bad.json()["errors"][0]["allowed"] == ["skip", "queue", "replace"]
    r = client.post("/suites", json={"name": "a", "spec": spec, "schedule": "* * * * *", "max_queued_runs": 2})
    assert r.status_code == 201 and (r.json()["concurrency_policy"], r.json()["max_queued_runs"]) == ("skip", 2)
    suite_id = r.json()["id"]
    assert client.post(f"/suites/{suite_id}/trigger").status_code == 201  # manual: the policy does not apply
    capped = client.post(f"/suites/{suite_id}/trigger")  # ... the cap does: 2 runs queued
    assert capped.status_code == 409 and capped.json()["errors"][0]["field"] == "max_queued_runs"
    patched = client.patch(f"/suites/{suite_id}", json={"concurrency_policy": "replace", "max_queued_runs": 50})
    assert (patched.json()["concurrency_policy"], patched.json()["max_queued_runs"]) == ("replace", 50)
    firings = client.get(f"/suites/{suite_id}/firings").json()
    assert [(f["trigger"], f["outcome"]) for f in firings] == [("manual", "skipped"), ("manual", "fired")]
    assert "max_queued_runs" in firings[0]["reason"] and firings[1]["num_runs"] == 2
    assert client.get("/suites/999/firings").status_code == 404
    with pytest.raises(ValueError):  # the update path checks too
        update_suite(None, None, concurrency_policy="forbid")  # type: ignore[arg-type]


def test_sqlite_refuses_an_unknown_policy_in_the_table(sqlite_url) -> None:
    engine = make_engine(sqlite_url)
    try:
        with make_session_factory(engine)() as s:
            make_suite(s, now=T)
            with pytest.raises(sa.exc.IntegrityError):
                s.execute(sa.text("UPDATE suites SET concurrency_policy = 'forbid'"))
                s.commit()
    finally:
        engine.dispose()
