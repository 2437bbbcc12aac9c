"""Regression detection over a finished suite experiment (list, ack and resolve: db/regressions.py).

For each series point of tonight's experiment and each metric, core.analysis.regression.evaluate gets the point's
history from the suite's earlier experiments (the last HISTORY_NIGHTS), the state of the point's last
finding, and the suite's thresholds; a finding opens, updates or closes a `regressions` row:

  suspected  a new row (first bad night)          confirmed  the open row, the next bad night
  failed     a new row, or the open failed row     recovered  closes the open row (resolution 'recovered')
  improved   a new (closed) record

Nights of an open regression are flagged and stay out of the baseline. A manual resolve means "accept":
the point's history before the resolution is dropped, so its baseline re-forms from the nights after it.
Pseudo-metric `run_status`: a point that used to succeed and now fails (all its repeats failed).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.analysis.regression import OPEN_STATES, Finding, MetricConfig, NightlyValue, evaluate
from db.base import utcnow
from db.experiments import statuses_for
from db.models import Experiment, Regression, Suite, SuiteEvaluation
from db.nightly_points import PointKey, PointNight, load_nights
from db.suites import metric_configs
from db.webhooks import enqueue_event

log = logging.getLogger(__name__)
HISTORY_NIGHTS = 30  # >= noise_nights (14) plus room for the flagged nights of an open regression
RUN_STATUS = "run_status"
RUN_STATUS_CONFIG = MetricConfig(RUN_STATUS, min_history=1)  # succeeded = 1.0; failures are the finding
TERMINAL_EXPERIMENT_STATUSES = ("succeeded", "failed", "cancelled")


def _configs(suite: Suite) -> dict[str, MetricConfig]:
    return {RUN_STATUS: RUN_STATUS_CONFIG, **metric_configs(suite)}


def nightly_value(p: PointNight, metric: str, flagged: frozenset[int] = frozenset()) -> NightlyValue | None:
    if metric == RUN_STATUS:
        value = 1.0 if p.status == "succeeded" else None
    elif p.status != "succeeded" or metric not in p.metrics:
        return None
    else:
        value = p.metrics[metric]
    return NightlyValue(
        timestamp=p.timestamp,
        status=p.status,
        value=value,
        run_id=p.run_id,
        environment=p.environment,
        flagged=p.experiment_id in flagged,
    )


def previous_experiments(session: Session, suite_id: int, before: datetime, limit: int = HISTORY_NIGHTS) -> list[int]:
    stmt = (
        sa.select(Experiment.id)
        .where(Experiment.suite_id == suite_id, Experiment.created_at < before)
        .order_by(Experiment.created_at.desc(), Experiment.id.desc())
        .limit(limit)
    )
    return list(reversed(list(session.scalars(stmt))))


def _series_rows(session: Session, suite_id: int) -> dict[tuple[str, str, str], list[Regression]]:
    out: dict[tuple[str, str, str], list[Regression]] = {}
    for r in session.scalars(sa.select(Regression).where(Regression.suite_id == suite_id).order_by(Regression.id)):
        out.setdefault((r.run_key, r.cluster, r.metric), []).append(r)
    return out


def _flagged(rows: list[Regression]) -> frozenset[int]:
    return frozenset(
        e["experiment_id"] for r in rows if r.resolution != "manual" for e in r.events if e["state"] in OPEN_STATES
    )


def _cutoff(rows: list[Regression]) -> datetime | None:
    return max((r.resolved_at for r in rows if r.resolution == "manual" and r.resolved_at), default=None)


def history_for(
    nights: dict[int, dict[PointKey, PointNight]],
    exp_ids: list[int],
    key: PointKey,
    metric: str,
    rows: list[Regression],
    after_manual_resolve: bool = True,
) -> list[NightlyValue]:
    """The point's nightly values in `exp_ids` order; flagged when part of an open (or recovered) episode;
    with after_manual_resolve, only the nights after the last manual resolution (the re-formed baseline)."""
    flagged, cutoff = _flagged(rows), _cutoff(rows) if after_manual_resolve else None
    out = []
    for i in exp_ids:
        p = nights.get(i, {}).get(key)
        v = nightly_value(p, metric, flagged) if p else None
        if v is not None and (cutoff is None or v.timestamp >= cutoff):
            out.append(v)
    return out


def _previous_state(rows: list[Regression]) -> str | None:
    last = rows[-1] if rows else None
    return None if last is None or last.resolution == "manual" else last.status


def detect_for_experiment(session: Session, experiment_id: int, now: datetime | None = None) -> list[Regression]:
    """Evaluate every point and metric of a finished suite experiment; store findings; mark it evaluated.

    The evaluation row is inserted with the findings: a concurrent second evaluation fails on its primary
    key (IntegrityError) and must roll back. Returns the regression rows created or changed.
    """
    now = now or utcnow()
    exp = session.get(Experiment, experiment_id)
    assert exp is not None and exp.suite_id is not None, f"experiment {experiment_id} is not a suite experiment"
    suite = session.get(Suite, exp.suite_id)
    assert suite is not None
    session.add(SuiteEvaluation(experiment_id=exp.id, suite_id=suite.id, evaluated_at=now))
    session.flush()  # claim first: a second evaluator stops here
    prev_ids = previous_experiments(session, suite.id, exp.created_at)
    nights = load_nights(session, [*prev_ids, exp.id])
    rows_by_series = _series_rows(session, suite.id)
    touched: list[Regression] = []
    for key, point in nights[exp.id].items():
        for metric, config in _configs(suite).items():
            current = nightly_value(point, metric)
            if current is None:
                continue
            rows = rows_by_series.get((*key, metric), [])
            history = history_for(nights, prev_ids, key, metric, rows)
            finding = evaluate(history, current, _previous_state(rows), config)
            if finding is not None and (row := _apply(session, suite, exp, point, finding, rows, now)):
                touched.append(row)
    evaluation = session.get(SuiteEvaluation, exp.id)
    assert evaluation is not None
    evaluation.num_points, evaluation.num_findings = len(nights[exp.id]), len(touched)
    session.flush()
    return touched


def _open_row(rows: list[Regression]) -> Regression | None:
    last = rows[-1] if rows else None
    return last if last and last.resolved_at is None and last.status in OPEN_STATES else None


def _apply(
    session: Session,
    suite: Suite,
    exp: Experiment,
    point: PointNight,
    f: Finding,
    rows: list[Regression],
    now: datetime,
) -> Regression | None:
    row, event = _open_row(rows), None
    if f.state == "recovered":
        if row is None:
            return None
        row.resolution, row.resolved_at, event = "recovered", now, "regression.recovered"
    elif f.state in ("suspected", "improved") or row is None or (f.state == "failed") != (row.status == "failed"):
        row = Regression(
            suite_id=suite.id,
            run_key=point.run_key,
            cluster=point.cluster,
            metric=f.metric,
            point=point.label,
            first_bad_experiment_id=exp.id if f.state in OPEN_STATES else None,
            events=[],
            num_bad_nights=0,
            created_at=now,
        )
        session.add(row)
        rows.append(row)
        event = f"regression.{f.state}"
    elif f.state == "confirmed" and row.status != "confirmed":
        event = "regression.confirmed"
    row.status, row.message, row.latest_experiment_id, row.updated_at = f.state, f.message, exp.id, now
    if f.state != "recovered":  # a closed row keeps the bad night's numbers; the recovery is in `events`
        row.value, row.baseline, row.band_low, row.band_high = f.value, f.baseline, f.band_low, f.band_high
        row.delta_pct = f.relative_change * 100 if f.relative_change is not None else None
    if f.state == "improved":
        row.resolution = None
    if f.env_diff is not None:
        row.env_diff = f.env_diff.model_dump(mode="json")
        row.first_bad_run_id = _int(f.env_diff.bad_run_id)
        row.last_good_run_id = _int(f.env_diff.good_run_id)
    row.num_bad_nights += f.state in OPEN_STATES
    row.events = [
        *row.events,
        {
            "at": point.timestamp.isoformat(),
            "state": f.state,
            "experiment_id": exp.id,
            "run_id": point.run_id,
            "value": f.value,
        },
    ]
    session.flush()
    if event is not None:
        enqueue_event(session, event, {"event": event, "regression": regression_payload(row, suite)}, row.id, now)
    return row


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def regression_payload(row: Regression, suite: Suite) -> dict[str, Any]:
    diff = row.env_diff or {}
    return {
        "id": row.id,
        "suite": {"id": suite.id, "name": suite.name},
        "metric": row.metric,
        "status": row.status,
        "run_key": row.run_key,
        "cluster": row.cluster,
        "point": row.point,
        "baseline": row.baseline,
        "value": row.value,
        "delta_pct": row.delta_pct,
        "message": row.message,
        "likely_cause": diff.get("likely_cause", []),
        "env_changes": [c for c in diff.get("changes", []) if c.get("changed")],
        "first_bad_experiment_id": row.first_bad_experiment_id,
        "first_bad_run_id": row.first_bad_run_id,
        "last_good_run_id": row.last_good_run_id,
        "dashboard": f"/static/regressions.html#{row.id}",  # the page, relative to the API's base URL
    }


# ------------------------------------------------------------------------------- finished experiments


def pending_evaluations(session: Session, limit: int = 200) -> list[tuple[int, int, bool]]:
    """(experiment id, suite id, finished) of suite experiments not yet evaluated, oldest first."""
    evaluated = sa.select(SuiteEvaluation.experiment_id).where(SuiteEvaluation.experiment_id == Experiment.id)
    stmt = (
        sa.select(Experiment.id, Experiment.suite_id)
        .where(Experiment.source == "suite", Experiment.suite_id.is_not(None), ~sa.exists(evaluated))
        .order_by(Experiment.created_at, Experiment.id)
        .limit(limit)
    )
    rows = list(session.execute(stmt))
    statuses = statuses_for(session, [r.id for r in rows])
    return [(r.id, r.suite_id, statuses[r.id].status in TERMINAL_EXPERIMENT_STATUSES) for r in rows]


def latest_evaluated_at(session: Session, suite_id: int) -> datetime | None:
    """created_at of the suite's newest evaluated experiment (older stragglers are not evaluated after it)."""
    stmt = (
        sa.select(sa.func.max(Experiment.created_at))
        .join(SuiteEvaluation, SuiteEvaluation.experiment_id == Experiment.id)
        .where(SuiteEvaluation.suite_id == suite_id)
    )
    return session.scalar(stmt)


def mark_skipped(session: Session, experiment_id: int, suite_id: int, now: datetime) -> None:
    session.add(SuiteEvaluation(experiment_id=experiment_id, suite_id=suite_id, evaluated_at=now))
    session.flush()
