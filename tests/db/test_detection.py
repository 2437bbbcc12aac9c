"""Detection over recorded nights on the real PostgreSQL: stable noise, a 10% drop, recovery, env diff,
failures, the fp8 loss gap and the effective speedup. Nights go through the suite's creation path and
db.runs.record_result."""

from __future__ import annotations

import math
import random
import statistics
from datetime import timedelta

import pytest
import sqlalchemy as sa

from db.models import Regression, SuiteEvaluation, WebhookDelivery
from db.webhooks import create_webhook
from tests.db.nights import ENV, T0, add_night, make_suite, noisy
from worker.nightly import evaluate_finished

OPEN = ("suspected", "confirmed", "failed")


def run_nights(factory, suite, nights, values):
    with factory() as s:
        for i in nights:
            add_night(s, suite, i, values)
            evaluate_finished(factory, T0 + timedelta(days=i, hours=1))


def regressions(session, **where):
    stmt = sa.select(Regression).filter_by(**where).order_by(Regression.id)
    return list(session.scalars(stmt.execution_options(populate_existing=True)))


def test_thirty_stable_nights_with_three_percent_noise_raise_no_alarm(pg_session_factory):
    with pg_session_factory() as s:
        suite = make_suite(s)
    run_nights(pg_session_factory, suite, range(30), noisy(seed=1))
    with pg_session_factory() as s:
        evaluations = list(s.scalars(sa.select(SuiteEvaluation)))
        assert len(evaluations) == 30 and all(e.num_points == 4 for e in evaluations)
        alarms = [r.message for r in regressions(s) if r.status in OPEN]
        assert alarms == []


def fp8_slower_with_new_torchao(bad_nights):
    """Stable nights with 3% noise; on `bad_nights` torchao changes and fp8 runs drop to 90% of their
    level (the median of their last 7 nights, as the baseline is defined)."""
    base, seen = noisy(seed=2), {}

    def values(night, spec):
        v = base(night, spec)
        past = seen.setdefault((spec.precision, spec.num_devices), [])
        if night in bad_nights:
            v["env"] = ENV | {"torchao_version": "0.19.0.dev"}
            if spec.precision != "bf16":
                v["tps"] = 0.90 * statistics.median(past[-7:])
                return v
        past.append(v["tps"])
        return v

    return values


def test_ten_percent_drop_suspected_then_confirmed_then_recovered_with_env_diff(pg_session_factory):
    with pg_session_factory() as s:
        suite = make_suite(s)
        create_webhook(s, "http://127.0.0.1:9/hook", events=["regression.confirmed"], allow_private=True)
        s.commit()
    values = fp8_slower_with_new_torchao(bad_nights={15, 16})
    run_nights(pg_session_factory, suite, range(15), values)
    with pg_session_factory() as s:
        assert regressions(s) == []

    run_nights(pg_session_factory, suite, [15], values)
    with pg_session_factory() as s:
        # At this seed fp8 N=1's 14 nights spread wide (3 robust sigma = 11.6% of its level), so its 10% drop
        # stays inside its band: no finding, as designed. fp8 N=2's band is 5.7%: it is caught. (Detection
        # rates over 200 seeds: tests/core/test_regression.py.)
        tps = regressions(s, metric="tokens_per_sec")
        assert [(r.status, r.point["precision"], r.point["num_devices"]) for r in tps] == [
            ("suspected", "fp8-tensorwise", 2)
        ]
        r = tps[0]
        assert r.delta_pct == pytest.approx(-10.0) and r.value < r.band_low
        assert r.env_diff["likely_cause"] == ["torchao_version"]  # the changed package, shown first
        assert r.env_diff["changes"][0] == {
            "key": "torchao_version",
            "before": "0.18.0",
            "after": "0.19.0.dev",
            "changed": True,
        }
        assert r.first_bad_run_id is not None and r.last_good_run_id is not None
        others = [x for x in regressions(s) if x.metric != "tokens_per_sec"]
        assert {(x.metric, x.status, x.point["precision"]) for x in others} <= {
            ("fp8_speedup", "suspected", "fp8-tensorwise")
        }  # bf16 points and E(N) did not move
        assert s.scalar(sa.select(sa.func.count(WebhookDelivery.id))) == 0  # suspected does not notify

    run_nights(pg_session_factory, suite, [16], values)
    with pg_session_factory() as s:
        tps = regressions(s, metric="tokens_per_sec")
        assert [r.status for r in tps] == ["confirmed"]  # the same row, one more bad night
        assert [r.id for r in tps] == [r.id for r in regressions(s, metric="tokens_per_sec")]
        assert [e["state"] for e in tps[0].events] == ["suspected", "confirmed"] and tps[0].num_bad_nights == 2
        deliveries = list(s.scalars(sa.select(WebhookDelivery)))
        assert {d.regression_id for d in deliveries} >= {r.id for r in tps}
        assert all(d.event == "regression.confirmed" and d.status == "pending" for d in deliveries)
        assert deliveries[0].payload["regression"]["likely_cause"] == ["torchao_version"]

    run_nights(pg_session_factory, suite, [17], values)
    with pg_session_factory() as s:
        rows = regressions(s)
        assert {r.status for r in rows} == {"recovered"}
        assert all(r.resolved_at is not None and r.resolution == "recovered" for r in rows)
        assert [e["state"] for e in rows[0].events] == ["suspected", "confirmed", "recovered"]


def test_failure_after_success_is_flagged_and_recovers(pg_session_factory):
    with pg_session_factory() as s:
        suite = make_suite(s)
    base = noisy(seed=3)

    def values(night, spec):
        v = base(night, spec)
        if night == 6 and spec.precision != "bf16" and spec.num_devices == 2:
            v["tps"] = None  # the run fails (oom)
        return v

    run_nights(pg_session_factory, suite, range(8), values)
    with pg_session_factory() as s:
        [r] = regressions(s)
        assert r.metric == "run_status" and r.point["num_devices"] == 2
        assert [e["state"] for e in r.events] == ["failed", "recovered"] and r.status == "recovered"
        assert r.first_bad_run_id is not None and r.env_diff["bad_run_id"] == str(r.first_bad_run_id)


def test_fp8_loss_drifting_from_bf16_beyond_its_limit(pg_session_factory):
    with pg_session_factory() as s:
        suite = make_suite(s, thresholds={"fp8_loss_gap": 0.02})
    base = noisy(seed=4)

    def values(night, spec):
        v = base(night, spec)
        if night >= 3 and spec.precision != "bf16":
            v["final_loss"] = 4.2  # 5% above bf16's 4.0
        return v

    run_nights(pg_session_factory, suite, range(5), values)
    with pg_session_factory() as s:
        rows = regressions(s, metric="fp8_loss_gap")
        assert [r.status for r in rows] == ["confirmed", "confirmed"]  # nights 3 and 4, both N
        assert rows[0].value > 0.04 and "limit 0.02" in rows[0].message


def loss_curve(rng: random.Random, stretch: float, num_steps: int = 200) -> list[float]:
    """A falling loss curve with 1% noise a step; `stretch` times the steps to reach each loss."""
    return [2.0 + 10.0 / math.sqrt(t / stretch + 10) * (1 + rng.gauss(0, 0.01)) for t in range(1, num_steps + 1)]


def test_fp8_needing_more_steps_to_the_same_loss_is_an_effective_speedup_regression(pg_session_factory):
    """fp8 keeps its throughput but needs 20% more steps to bf16's loss from night 8: the effective speedup
    (S(N) / steps_ratio, from the runs' curves) drops and the nightly check flags it; the throughput metrics
    do not move."""
    with pg_session_factory() as s:
        suite = make_suite(s)
    base, rng = noisy(seed=6), random.Random(6)

    def values(night, spec):
        stretch = 1.2 if night >= 8 and spec.precision != "bf16" else 1.0
        return base(night, spec) | {"curve": loss_curve(rng, stretch)}

    run_nights(pg_session_factory, suite, range(8), values)
    with pg_session_factory() as s:
        assert regressions(s, metric="effective_speedup") == []
    run_nights(pg_session_factory, suite, [8], values)
    with pg_session_factory() as s:
        rows = regressions(s, metric="effective_speedup")
        assert [(r.status, r.point["precision"], r.point["num_devices"]) for r in rows] == [
            ("suspected", "fp8-tensorwise", 1),
            ("suspected", "fp8-tensorwise", 2),
        ]
        assert all(r.value < r.band_low and r.delta_pct < -8 for r in rows), [r.message for r in rows]
        assert [r.message for r in regressions(s) if r.metric in ("tokens_per_sec", "fp8_speedup")] == []
