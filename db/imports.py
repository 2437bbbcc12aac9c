"""Runs measured elsewhere: stored as an experiment (source 'import') whose runs are already succeeded.

Bulk statements whatever the number of points: the experiment and its runs (db.experiments.create_experiment,
runs flagged imported), one bulk UPDATE of the runs to their outcome, one INSERT of summaries, one of steps.
The runs never sit committed as queued, so no dispatcher or worker ever sees them. Never commits.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.specs import ExperimentSpec, RunResult, RunSpec
from db.experiments import create_experiment
from db.models import Experiment, Run, RunSummary, StepMetric, utcnow

IMPORT_QUEUE = "import"  # no worker consumes it; recorded for completeness


def record_imported(session: Session, spec: ExperimentSpec, runs: Sequence[RunSpec],
                    results: Sequence[RunResult]) -> tuple[Experiment, list[int]]:
    """Insert an imported experiment with one run per (RunSpec, RunResult) pair; returns it and the run ids."""
    assert len(runs) == len(results), "one result per run"
    exp, run_ids = create_experiment(session, spec, runs, IMPORT_QUEUE, source="import")
    now = utcnow()
    session.execute(sa.update(Run), [{
        "id": run_id, "status": res.status, "result": res.model_dump(mode="json", exclude={"steps"}),
        "started_at": now, "finished_at": now, "attempts": 0,
        "error_kind": res.error.kind if res.error else None,
        "error_message": res.error.message if res.error else None,
    } for run_id, res in zip(run_ids, results)])
    summaries = [{"run_id": run_id, **res.summary.model_dump()}
                 for run_id, res in zip(run_ids, results) if res.summary is not None]
    if summaries:
        session.execute(sa.insert(RunSummary), summaries)
    steps = [{"run_id": run_id, **s.model_dump()} for run_id, res in zip(run_ids, results) for s in res.steps]
    if steps:
        session.execute(sa.insert(StepMetric), steps)
    return exp, run_ids
