"""Run lifecycle on PostgreSQL and SQLite: atomic claim, heartbeat, results, failures, reaping, cancel."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import db.runs
from db.base import utcnow
from db.experiments import cancel_experiment, experiment_status
from db.session import session_scope
from tests.db.helpers import add_experiment, failed_result, succeeded_result


def test_claim_is_conditional_and_counts_attempts(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
    with session_scope(factory) as s:
        assert db.runs.claim_run(s, ids[0], "w1", "h1", lease_s=30)
        assert not db.runs.claim_run(s, ids[0], "w2", "h2", lease_s=30)  # a redelivered message finds it claimed
        assert not db.runs.claim_run(s, 10**6, "w2", "h2", lease_s=30)
    with factory() as s:
        run = db.runs.get_run(s, ids[0])
        assert (run.status, run.attempts, run.worker, run.host) == ("running", 1, "w1", "h1")
        assert run.lease_expires_at - run.heartbeat_at == timedelta(seconds=30)


def test_concurrent_claims_have_one_winner(pg_session_factory):
    with session_scope(pg_session_factory) as s:
        _, ids = add_experiment(s)
    wins: list[int | None] = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait()
        with session_scope(pg_session_factory) as s:
            wins.append(db.runs.claim_run(s, ids[0], f"w{i}", "h", lease_s=30))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins, key=lambda w: w or 0) == [None] * 7 + [1]  # one winner, given lease 1


def test_heartbeat_extends_lease_and_reports_cancel(factory):
    with session_scope(factory) as s:
        exp_id, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w1", "h", lease_s=5)
    with session_scope(factory) as s:
        later = utcnow() + timedelta(seconds=3)
        assert db.runs.heartbeat(s, ids[0], 60, worker="w1", now=later) == db.runs.LeaseState(True, False)
        assert not db.runs.heartbeat(s, ids[0], 60, worker="someone-else").owned
        assert not db.runs.heartbeat(s, ids[1], 60).owned  # queued: nobody owns it
        assert cancel_experiment(s, exp_id) == (len(ids) - 1, 1)
        assert db.runs.heartbeat(s, ids[0], 60, worker="w1", now=later) == db.runs.LeaseState(True, True)
    with factory() as s:
        assert db.runs.get_run(s, ids[0]).lease_expires_at == later + timedelta(seconds=60)


def test_record_succeeded_result_stores_summary_and_steps(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        db.runs.update_launch(s, ids[0], run_dir="/tmp/run-1", slurm_job_id="42")
        assert db.runs.record_result(s, ids[0], succeeded_result(num_steps=5))
    with factory() as s:
        run = db.runs.get_run(s, ids[0])
        assert (run.status, run.error_kind, run.run_dir, run.slurm_job_id) == ("succeeded", None, "/tmp/run-1", "42")
        assert run.result["numerics"]["final_loss"] == 4.7 and "steps" not in run.result
        assert db.runs.get_summary(s, ids[0]).tokens_per_sec == 1.5e5
        steps = db.runs.get_steps(s, ids[0])
        assert [x.step for x in steps] == [0, 1, 2, 3, 4] and steps[0].warmup and steps[1].loss == pytest.approx(4.9)


def test_record_failed_result_and_mark_failed(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        assert db.runs.record_result(s, ids[0], failed_result("oom", "out of memory"))
        assert db.runs.mark_failed(s, ids[1], "launch_error", "torchrun not found")
        assert not db.runs.mark_failed(s, ids[1], "error", "again")  # already ended
        with pytest.raises(ValueError, match="error kind: 'nope' is not one of: invalid_config"):
            db.runs.mark_failed(s, ids[2], "nope", "x")
    with factory() as s:
        assert (db.runs.get_run(s, ids[0]).error_kind, db.runs.get_run(s, ids[0]).error_message) == (
            "oom",
            "out of memory",
        )
        assert db.runs.get_run(s, ids[1]).error_kind == "launch_error"
        assert db.runs.get_summary(s, ids[0]) is None


def test_result_after_cancel_is_not_recorded(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        assert db.runs.mark_cancelled(s, ids[0], "stopped by worker")
        assert not db.runs.record_result(s, ids[0], succeeded_result())
    with factory() as s:
        assert db.runs.get_run(s, ids[0]).status == "cancelled" and db.runs.get_steps(s, ids[0]) == []


def test_reap_requeues_then_fails_after_max_attempts(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w", "h", lease_s=10)
        s.execute(db.runs.sa.update(db.runs.Run).where(db.runs.Run.id == ids[0]).values(dispatched_at=utcnow()))
    future = utcnow() + timedelta(seconds=11)
    with session_scope(factory) as s:
        assert db.runs.reap_expired(s, utcnow(), max_attempts=2) == ([], [])  # lease still valid
        assert db.runs.reap_expired(s, future, max_attempts=2) == ([ids[0]], [])
    with session_scope(factory) as s:
        run = db.runs.get_run(s, ids[0])
        assert (run.status, run.dispatched_at, run.worker, run.attempts) == ("queued", None, None, 1)
        assert db.runs.claim_run(s, ids[0], "w2", "h", lease_s=10)
    with session_scope(factory) as s:
        assert db.runs.reap_expired(s, utcnow() + timedelta(seconds=11), max_attempts=2) == ([], [ids[0]])
    with factory() as s:
        run = db.runs.get_run(s, ids[0])
        assert (run.status, run.error_kind, run.attempts) == ("failed", "worker_lost", 2)


def test_reap_cancels_a_lost_run_with_pending_cancel(factory):
    with session_scope(factory) as s:
        exp_id, ids = add_experiment(s)
        db.runs.claim_run(s, ids[0], "w", "h", lease_s=1)
        cancel_experiment(s, exp_id)
        assert db.runs.reap_expired(s, utcnow() + timedelta(seconds=5)) == ([], [ids[0]])
        assert experiment_status(s, exp_id).status == "cancelled"


def test_update_launch_moves_between_pending_and_running(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        assert not db.runs.update_launch(s, ids[0], status="pending")  # not claimed yet
        db.runs.claim_run(s, ids[0], "w", "h", 30)
        assert db.runs.update_launch(s, ids[0], status="pending", slurm_job_id="7")
        with pytest.raises(ValueError, match="allowed: pending, running"):
            db.runs.update_launch(s, ids[0], status="succeeded")
    with factory() as s:
        assert (db.runs.get_run(s, ids[0]).status, db.runs.get_run(s, ids[0]).slurm_job_id) == ("pending", "7")


def test_a_requeued_run_keeps_its_place_in_the_claim_order(factory):
    """Run a's worker died: a is requeued (its message consumed, not yet published again). The next message, of a
    later run, starts a first (submission order), and the newest published run gives its message back so that
    every published run still has one (the dispatcher publishes it anew)."""
    from db.outbox import lock_undispatched, stamp_dispatched

    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        stamp_dispatched(s, ids)  # every run published
    a, b, newest = ids[0], ids[1], ids[-1]
    with session_scope(factory) as s:
        assert db.runs.claim_run(s, a, "w1", "h", lease_s=5)
    with session_scope(factory) as s:
        requeued, failed = db.runs.reap_expired(s, now=utcnow() + timedelta(seconds=60))
        assert (requeued, failed) == ([a], [])
    with session_scope(factory) as s:
        assert db.runs.claim_candidates(s, b)[0] == a  # before b and every later run
        assert db.runs.claim_run(s, a, "w2", "h", lease_s=30)
        assert [i for i, _ in lock_undispatched(s, None, 10)] == [newest]  # its message given back
    with session_scope(factory) as s:
        stamp_dispatched(s, [newest])
        assert db.runs.claim_candidates(s, b)[0] == b  # then the others, in order
        assert db.runs.claim_run(s, b, "w3", "h", lease_s=30)
        assert lock_undispatched(s, None, 10) == []  # a published run's own claim gives nothing back


def test_a_run_never_published_is_not_taken_by_another_message(factory):
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
        from db.outbox import stamp_dispatched

        stamp_dispatched(s, ids[1:])
    with session_scope(factory) as s:
        assert ids[0] not in db.runs.claim_candidates(s, ids[1])  # its publisher is sending its message
        assert db.runs.claim_candidates(s, ids[0])[0] == ids[0]  # ... which starts it


def test_a_stale_lease_is_refused_every_write_once_the_run_moved_on(factory):
    """Fencing: lease 1 was reaped (its worker paused past the lease) and the run claimed again as lease 2;
    every write naming lease 1 is refused and changes nothing, the same writes under lease 2 are taken."""
    with session_scope(factory) as s:
        _, ids = add_experiment(s)
    run_id = ids[0]
    with session_scope(factory) as s:
        assert db.runs.claim_run(s, run_id, "w1", "h", lease_s=5) == 1
        assert db.runs.update_launch(s, run_id, run_dir="/runs/run-1/lease-1", lease_id=1)
        assert db.runs.store_log(s, run_id, b"attempt 1\n", 10, lease_id=1)
    with session_scope(factory) as s:
        reaped = db.runs.reap_expired_runs(s, now=utcnow() + timedelta(seconds=60))
        assert reaped.requeued == [run_id] and reaped.run_dirs == {run_id: "/runs/run-1/lease-1"}
    with session_scope(factory) as s:
        assert db.runs.claim_run(s, run_id, "w1", "h", lease_s=60) == 2  # the same worker name: the lease tells
        assert db.runs.update_launch(s, run_id, run_dir="/runs/run-1/lease-2", lease_id=2)
    stale, current = 1, 2
    with session_scope(factory) as s:
        assert not db.runs.heartbeat(s, run_id, 60, "w1", lease_id=stale).owned
        assert not db.runs.update_launch(s, run_id, run_dir="/runs/run-1/lease-1", lease_id=stale)
        assert not db.runs.update_launch(s, run_id, status="pending", lease_id=stale)
        assert not db.runs.store_log(s, run_id, b"stale\n", 6, final=True, lease_id=stale)
        assert not db.runs.store_trace(s, run_id, 0, b"\x1f\x8b", lease_id=stale)
        assert not db.runs.record_result(s, run_id, failed_result(), lease_id=stale)
        assert not db.runs.requeue_for_retry(s, run_id, "node lost", lease_id=stale)
        assert not db.runs.requeue_interrupted(s, run_id, "w1", "stopping", refund_attempt=True, lease_id=stale)
        assert not db.runs.mark_cancelled(s, run_id, lease_id=stale)
        assert not db.runs.mark_failed(s, run_id, "infrastructure", "x", lease_id=stale)
    with session_scope(factory) as s:
        run = db.runs.get_run(s, run_id)
        assert (run.status, run.lease_id, run.attempts, run.run_dir) == ("running", 2, 2, "/runs/run-1/lease-2")
        assert db.runs.get_log(s, run_id).text == "attempt 1\n" and not db.runs.trace_ranks(s, run_id)
    with session_scope(factory) as s:
        assert db.runs.heartbeat(s, run_id, 60, "w1", lease_id=current).owned
        assert db.runs.store_log(s, run_id, b"attempt 2\n", 10, final=True, lease_id=current)
        assert db.runs.record_result(s, run_id, succeeded_result(), lease_id=current)
    with session_scope(factory) as s:
        run = db.runs.get_run(s, run_id)
        assert run.status == "succeeded" and db.runs.get_log(s, run_id).text == "attempt 2\n"
        # ended: even the lease that finished it writes nothing more
        assert not db.runs.store_log(s, run_id, b"late\n", 5, final=True, lease_id=current)
