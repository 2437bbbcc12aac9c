"""Runs measured elsewhere: stored as an experiment (source 'import') whose runs are already succeeded.

Written in bounded transactions, so that a large import never holds SQLite's one write lock for seconds
(worker heartbeats and claims share it). The edge (api/routers/imports.py) commits after each step:

  1. record_imported   the experiment, its runs (already at their outcome, finished_at still NULL) and
                       their summaries; bulk statements whatever the number of points
  2. insert_steps      the step records, IMPORT_STEP_ROWS per transaction (step_chunks cuts them)
  3. finish_imported   finished_at set on every run: the experiment's ETag fingerprint moves, so a reader
                       that saw it mid-import (succeeded runs, part of the loss curves) reads it again

The runs never sit committed as queued, so no dispatcher or worker ever sees them. Functions never commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.specs import ExperimentSpec, RunResult, RunSpec
from db.experiments import create_experiment
from db.models import Experiment, Run, RunSummary, StepMetric, utcnow

IMPORT_QUEUE = "import"  # no worker consumes it; recorded for completeness
IMPORT_STEP_ROWS = 5_000  # step rows per transaction: ~30-60 ms of SQLite write lock each


def record_imported(session: Session, spec: ExperimentSpec, runs: Sequence[RunSpec],
                    results: Sequence[RunResult]) -> tuple[Experiment, list[int]]:
    """Insert an imported experiment with one run per (RunSpec, RunResult) pair, and the runs' summaries (not
    their steps: see insert_steps); returns it and the run ids."""
    assert len(runs) == len(results), "one result per run"
    exp, run_ids = create_experiment(session, spec, runs, IMPORT_QUEUE, source="import")
    session.execute(sa.update(Run), [{
        "id": run_id, "status": res.status, "result": res.model_dump(mode="json", exclude={"steps"}),
        "attempts": 0, "error_kind": res.error.kind if res.error else None,
        "error_message": res.error.message if res.error else None,
    } for run_id, res in zip(run_ids, results)])
    summaries = [{"run_id": run_id, **res.summary.model_dump()}
                 for run_id, res in zip(run_ids, results) if res.summary is not None]
    if summaries:
        session.execute(sa.insert(RunSummary), summaries)
    return exp, run_ids


def step_chunks(run_ids: Sequence[int], results: Sequence[RunResult],
                rows_per_chunk: int = IMPORT_STEP_ROWS) -> Iterator[list[dict[str, Any]]]:
    """The step rows of every run, at most rows_per_chunk per list."""
    chunk: list[dict[str, Any]] = []
    for run_id, res in zip(run_ids, results):
        for s in res.steps:
            chunk.append({"run_id": run_id, **s.model_dump()})
            if len(chunk) >= rows_per_chunk:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def insert_steps(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        session.execute(sa.insert(StepMetric), list(rows))


def finish_imported(session: Session, run_ids: Sequence[int]) -> None:
    """The import is complete: every run gets its start and finish time (one statement)."""
    now = utcnow()
    session.execute(sa.update(Run).where(Run.id.in_(list(run_ids)))
                    .values(started_at=now, finished_at=now).execution_options(synchronize_session=False))
