"""A webhook receiver that accepts connections and never answers holds up neither the reaper nor the suites:
the real scheduler process (`python -m worker.scheduler`) with six such receivers, a `* * * * *` suite and runs
whose lease expired. Deliveries run on their own thread, at most MAX_CONCURRENT at once, one at a time per
receiver, and a receiver that timed out is left alone for its back-off."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

import db.runs
import db.webhooks
from core.contracts.specs import ExperimentSpec
from db.base import utcnow
from db.models import Run, Suite, SuiteFiring, WebhookDelivery
from db.session import session_scope
from db.suites import create_suite
from tests.db.helpers import add_experiment
from tests.worker.conftest import REPO, wait_until
from worker.webhooks import MAX_CONCURRENT, TIMEOUT_S

pytestmark = pytest.mark.slow
NUM_RECEIVERS = 6


class SilentReceiver:
    """Listens on 127.0.0.N:port, accepts every connection and never answers; counts what it was sent."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        self.num_accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.num_accepted += 1
            self.held.append(conn)

    def num_open(self) -> int:
        """Connections the sender still holds open (it has not given up on them yet)."""
        alive = 0
        for conn in self.held:
            try:
                conn.setblocking(False)
                alive += conn.recv(1 << 16, socket.MSG_PEEK) != b""
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _expired_run(session_factory) -> int:
    """A run claimed by a worker that vanished: its lease ended a second ago."""
    with session_scope(session_factory) as s:
        _, (run_id, *_) = add_experiment(s)
        assert db.runs.claim_run(s, run_id, "gone-host:1", "gone-host", lease_s=60)
        s.execute(sa.update(Run).where(Run.id == run_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    return run_id


def test_silent_receivers_delay_no_reaper_pass_and_no_suite_firing(cell) -> None:
    receivers = [SilentReceiver(f"127.0.0.{i + 2}") for i in range(NUM_RECEIVERS)]
    sf = cell.session_factory
    spec = ExperimentSpec.model_validate(
        {
            "name": "every minute",
            "model": "debug",
            "gpu_counts": [1],
            "precisions": ["fp32"],
            "steps": 3,
            "warmup_steps": 1,
        }
    )
    with session_scope(sf) as s:
        for r in receivers:
            db.webhooks.create_webhook(s, r.url, events=["regression.confirmed"], allow_private=True)
        for _ in range(3):  # 18 deliveries, 3 per receiver
            db.webhooks.enqueue_event(s, "regression.confirmed", {"suite": "x"})
        suite = create_suite(s, name="every-minute", spec=spec, cluster=cell.name, schedule="* * * * *")
        suite.next_fire_at, suite.concurrency_policy = utcnow(), "queue"  # due now
        suite_id = suite.id
    first_run = _expired_run(sf)
    env = cell.env | {"SCALEBENCH_WEBHOOK_ALLOW_PRIVATE": "1"}
    intervals = ["--reap-interval-s", "1", "--dispatch-interval-s", "1", "--nightly-interval-s", "1"]
    log_path = cell.tmp / "scheduler.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.scheduler", *intervals, "--webhook-interval-s", "1"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def firings() -> list[SuiteFiring]:
            with sf() as s:
                return list(s.scalars(sa.select(SuiteFiring).where(SuiteFiring.suite_id == suite_id)))

        wait_until(lambda: cell.run(first_run).status == "queued", 30, "the first reaper pass")
        wait_until(lambda: firings(), 30, "the first firing")
        wait_until(lambda: sum(r.num_accepted for r in receivers) >= MAX_CONCURRENT, 30, "deliveries to start")
        # Now the receivers hold the sender's connections (each attempt waits TIMEOUT_S for an answer). A run's
        # lease expires and the suite falls due again: the scheduler's loop takes both within two of its passes.
        t0 = time.monotonic()
        second_run = _expired_run(sf)
        with session_scope(sf) as s:
            s.execute(sa.update(Suite).where(Suite.id == suite_id).values(next_fire_at=utcnow()))
        wait_until(lambda: cell.run(second_run).status == "queued", 3 * TIMEOUT_S, "the reaper while receivers hang")
        reaped_s = time.monotonic() - t0
        wait_until(lambda: len(firings()) == 2, 3 * TIMEOUT_S, "the second firing while receivers hang")
        fired_s = time.monotonic() - t0
        held = sum(r.num_open() for r in receivers)
        assert held >= 1, "the receivers were not holding any delivery: the test measured nothing"
        # A loop that waited on the receivers would be held two rounds of TIMEOUT_S (six receivers, MAX_CONCURRENT
        # at once) from when they were first sent to; with 1 s intervals it takes a pass or two, on a slow, busy
        # host seconds more. TIMEOUT_S tells the two apart without timing the host.
        assert reaped_s < TIMEOUT_S and fired_s < TIMEOUT_S, (reaped_s, fired_s)
        assert all(f.outcome == "fired" for f in firings()), [(f.outcome, f.reason) for f in firings()]
        # Bounded: never more than MAX_CONCURRENT connections at once, one per receiver; after a timeout a
        # receiver is in back-off: within the first pass's window each got one attempt, not three.
        wait_until(lambda: sum(r.num_accepted for r in receivers) >= NUM_RECEIVERS, 2 * TIMEOUT_S + 10, "all")
        time.sleep(2)
        assert all(r.num_accepted == 1 for r in receivers), [r.num_accepted for r in receivers]
        with sf() as s:
            attempts = s.scalars(sa.select(WebhookDelivery.attempt)).all()
        assert sorted(attempts) == [0] * (2 * NUM_RECEIVERS) + [1] * NUM_RECEIVERS, attempts
        print(f"reaped {reaped_s:.2f} s, fired {fired_s:.2f} s after falling due, with {held} deliveries held")
    finally:
        proc.terminate()
        proc.wait(15)
        for r in receivers:
            r.close()
    assert proc.returncode in (0, -15), log_path.read_text()[-3000:]
