"""Runs measured elsewhere: stored as an experiment (source 'import') whose runs are already succeeded.

Written in bounded transactions, so that a large import never holds SQLite's one write lock for seconds
(worker heartbeats and claims share it). The edge (api/routers/imports.py) commits after each step:

  1. record_imported   the experiment, its runs (already at their outcome, finished_at still NULL) and
                       their summaries; bulk statements whatever the number of points
  2. store_results     the runs' result JSON (environment, numerics with the loss and held-out curves),
                       runs grouped so that each transaction carries about IMPORT_STEP_ROWS loss values
                       (result_chunks)
  3. insert_steps      the step records (an imported run's steps are its loss curve, with step times when
                       a log gave them), IMPORT_STEP_ROWS per transaction (step_chunks cuts them)
  4. insert_loss_curves  the loss-curve rows, the table a measured run's curve is stored in when its result
                       is recorded (db.points.loss_curve_row: thinned to STORED_CURVE_POINTS), which the fp8
                       loss verdict and /losses read; about IMPORT_STEP_ROWS stored values per transaction
  5. finish_imported   finished_at set on every run: the experiment's ETag fingerprint moves, so a reader
                       that saw it mid-import (succeeded runs, part of the loss curves) reads it again

The runs never sit committed as queued, so no dispatcher or worker ever sees them. Functions never commit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.contracts.specs import ExperimentSpec, RunResult, RunSpec
from db.base import utcnow
from db.experiments import create_experiment
from db.models import Experiment, Run, RunLossCurve, RunSummary, StepMetric
from db.points import STORED_CURVE_POINTS, loss_curve_row

IMPORT_QUEUE = "import"  # no worker consumes it; recorded for completeness
IMPORT_STEP_ROWS = 10_000  # step rows (or loss values in results) per transaction: ~100-200 ms of SQLite write lock
# Between two of its transactions an import leaves SQLite's write lock free this long: a writer waiting in
# SQLite's busy handler sleeps up to 100 ms between tries, and would starve if the lock were taken again
# at once. PostgreSQL locks rows, not the database: no pause there.
SQLITE_WRITE_GAP_S = 0.1


def record_imported(
    session: Session, spec: ExperimentSpec, runs: Sequence[RunSpec], results: Sequence[RunResult]
) -> tuple[Experiment, list[int]]:
    """Insert an imported experiment with one run per (RunSpec, RunResult) pair, and the runs' summaries (not
    their result JSON nor their steps: see store_results, insert_steps); returns it and the run ids."""
    assert len(runs) == len(results), "one result per run"
    exp, run_ids = create_experiment(session, spec, runs, IMPORT_QUEUE, source="import")
    session.execute(
        sa.update(Run),
        [
            {
                "id": run_id,
                "status": res.status,
                "attempts": 0,
                "error_kind": res.error.kind if res.error else None,
                "error_message": res.error.message if res.error else None,
            }
            for run_id, res in zip(run_ids, results)
        ],
    )
    summaries = [
        {
            "run_id": run_id,
            **res.summary.model_dump(),
            "final_loss": res.numerics.final_loss if res.numerics is not None else None,
        }
        for run_id, res in zip(run_ids, results)
        if res.summary is not None
    ]
    if summaries:
        session.execute(sa.insert(RunSummary), summaries)
    return exp, run_ids


def result_chunks(
    run_ids: Sequence[int], results: Sequence[RunResult], values_per_chunk: int = IMPORT_STEP_ROWS
) -> Iterator[list[tuple[int, RunResult]]]:
    """(run id, result) pairs grouped so that a group holds about values_per_chunk loss values (a run at least)."""
    chunk: list[tuple[int, RunResult]] = []
    size = 0
    for run_id, res in zip(run_ids, results):
        chunk.append((run_id, res))
        size += 1 + (len(res.numerics.loss_curve) if res.numerics else 0)
        if size >= values_per_chunk:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def store_results(session: Session, pairs: Sequence[tuple[int, RunResult]]) -> None:
    """The result JSON (RunResult without steps) of each (run id, result) pair, one bulk UPDATE."""
    if pairs:
        session.execute(
            sa.update(Run),
            [{"id": run_id, "result": res.model_dump(mode="json", exclude={"steps"})} for run_id, res in pairs],
        )


STEP_COLUMNS = ("run_id", "step", "loss", "step_ms", "tokens", "grad_norm", "lr", "warmup")


@dataclass(frozen=True)
class ImportedSteps:
    """One imported run's steps as plain (step, loss, step_ms, tokens, warmup) tuples, in step order (a
    point's loss curve, or a log's steps with their times). Plain tuples: 500,000 StepRecord objects cost
    seconds."""

    rows: list[tuple[int, float | None, float | None, int, bool]]
    evals: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # held-out (step, loss), in order

    def losses(self) -> list[tuple[int, float]]:
        return [(s, loss) for s, loss, *_ in self.rows if loss is not None]


def step_chunks(
    run_ids: Sequence[int], steps: Sequence[ImportedSteps], rows_per_chunk: int = IMPORT_STEP_ROWS
) -> Iterator[list[tuple[Any, ...]]]:
    """The step rows of every run as STEP_COLUMNS tuples, at most rows_per_chunk per list."""
    chunk: list[tuple[Any, ...]] = []
    for run_id, run_steps in zip(run_ids, steps):
        for step, loss, step_ms, tokens, warmup in run_steps.rows:
            chunk.append((run_id, step, loss, step_ms, tokens, None, None, warmup))
            if len(chunk) >= rows_per_chunk:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def curve_chunks(
    run_ids: Sequence[int], steps: Sequence[ImportedSteps], values_per_chunk: int = IMPORT_STEP_ROWS
) -> Iterator[list[dict[str, Any]]]:
    """The run_loss_curves rows of the runs with a loss, grouped so that a group stores about
    values_per_chunk steps (a curve stores at most STORED_CURVE_POINTS)."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for run_id, run_steps in zip(run_ids, steps):
        if points := run_steps.losses():
            chunk.append(loss_curve_row(run_id, points, run_steps.evals))
            size += min(len(points), STORED_CURVE_POINTS)
            if size >= values_per_chunk:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def insert_loss_curves(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """One executemany of run_loss_curves rows (the runs are new: nothing to replace)."""
    if rows:
        session.execute(sa.insert(RunLossCurve), list(rows))


def insert_steps(session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
    """One DBAPI executemany of STEP_COLUMNS tuples. SQLAlchemy's per-row parameter processing (ORM or Core)
    costs ~10x the insert itself at 500,000 rows; these columns need none (ints, floats, bools, NULLs)."""
    if not rows:
        return
    conn = session.connection()
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = (
        f"INSERT INTO {StepMetric.__tablename__} ({', '.join(STEP_COLUMNS)}) "
        f"VALUES ({', '.join([mark] * len(STEP_COLUMNS))})"
    )
    conn.exec_driver_sql(sql, list(rows))


def pause_for_other_writers(session: Session) -> None:
    """Call between two transactions of an import: on SQLite, let a waiting writer (a heartbeat) take the lock."""
    if session.get_bind().dialect.name == "sqlite":
        time.sleep(SQLITE_WRITE_GAP_S)


def finish_imported(session: Session, run_ids: Sequence[int]) -> None:
    """The import is complete: every run gets its start and finish time (one statement)."""
    now = utcnow()
    session.execute(
        sa.update(Run)
        .where(Run.id.in_(list(run_ids)))
        .values(started_at=now, finished_at=now)
        .execution_options(synchronize_session=False)
    )
