"""Reads a projection needs beyond the scaling points: step breakdowns and the device name of an experiment.

load_breakdowns  1 query (succeeded runs' result.breakdown.median, medianed per (precision, layout, N))
device_name      1 query (the first succeeded run's environment.device_name)
"""

from __future__ import annotations

import statistics

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import Run


def load_breakdowns(session: Session, experiment_id: int) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per (precision, layout, N): the median over succeeded repeats of each ms-per-step key of
    result["breakdown"]["median"]; points whose runs carry no breakdown are absent."""
    stmt = (
        sa.select(Run.precision, Run.layout, Run.num_devices, Run.result[("breakdown", "median")])
        .where(Run.experiment_id == experiment_id, Run.status == "succeeded")
        .order_by(Run.id)
    )
    values: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for precision, layout, n, median in session.execute(stmt):
        if not isinstance(median, dict):
            continue
        keyed = values.setdefault((precision, layout, n), {})
        for k, v in median.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                keyed.setdefault(k, []).append(float(v))
    return {key: {k: statistics.median(vs) for k, vs in keyed.items()} for key, keyed in values.items()}


def device_name(session: Session, experiment_id: int) -> str | None:
    stmt = (
        sa.select(Run.result[("environment", "device_name")].as_string())
        .where(Run.experiment_id == experiment_id, Run.status == "succeeded")
        .order_by(Run.id)
        .limit(1)
    )
    return session.scalar(stmt)
