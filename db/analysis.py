"""Analysis reads: runs as core.scaling.RunPoint rows, change fingerprints for ETags, downsampled loss curves.

Each function is a bounded number of queries whatever the experiment's size (no N+1):
  load_run_points      1 query  (runs LEFT JOIN run_summaries; model/layers/scaling read from the run spec JSON)
  fingerprints         1 query  (per-status counts and max timestamps; no step_metrics scan)
  loss_curves          2 queries (which runs, then their steps thinned in SQL to <= max_points per run)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session

from core.scaling import RunPoint
from db.models import Experiment, Run, RunSummary, StepMetric

# Cancelled runs are left out of the curves: the point they belonged to shows as missing (nothing was
# measured), not as a failure of the configuration and not as pending forever.
EXCLUDED_FROM_CURVES = ("cancelled",)


class _final_loss(sa.sql.expression.FunctionElement):
    """runs.result -> numerics.final_loss. On SQLite a result JSON that is not valid (Infinity or NaN written
    before JSON columns were strict) reads as NULL instead of failing the whole query ("malformed JSON")."""

    type = sa.Float()
    inherit_cache = True


@compiles(_final_loss)
def _final_loss_default(element: _final_loss, compiler: Any, **kw: Any) -> str:
    return compiler.process(Run.result[("numerics", "final_loss")].as_float(), **kw)


@compiles(_final_loss, "sqlite")
def _final_loss_sqlite(element: _final_loss, compiler: Any, **kw: Any) -> str:
    valid = compiler.process(sa.func.json_valid(Run.result), **kw)
    return f"CASE WHEN {valid} THEN {_final_loss_default(element, compiler, **kw)} END"


def _run_point_select() -> sa.Select:
    spec = Run.spec
    return (
        sa.select(
            Run.experiment_id, Run.id, spec["model"].as_string(), spec["num_layers"].as_integer(),
            Run.precision, Run.layout, spec["scaling"].as_string(), Run.cluster, Run.num_devices, Run.status,
            RunSummary.tokens_per_sec, RunSummary.step_ms_median, RunSummary.mfu_vs_bf16_peak,
            RunSummary.mfu_vs_precision_peak, RunSummary.peak_memory_allocated_gib,
            _final_loss(), Run.imported,
        )
        .outerjoin(RunSummary, RunSummary.run_id == Run.id)
        .where(Run.status.not_in(EXCLUDED_FROM_CURVES))
        .order_by(Run.experiment_id, Run.id)
    )


# Built once: constructing the statement costs more than compiling it (which SQLAlchemy caches anyway).
_RUN_POINTS = _run_point_select().where(Run.experiment_id.in_(sa.bindparam("experiment_ids", expanding=True)))


def load_run_points_many(session: Session, experiment_ids: Sequence[int]) -> dict[int, list[RunPoint]]:
    """RunPoints of several experiments in one query, keyed by experiment id (every id present)."""
    out: dict[int, list[RunPoint]] = {i: [] for i in experiment_ids}
    for row in session.execute(_RUN_POINTS, {"experiment_ids": list(experiment_ids)}):
        (exp_id, run_id, model, num_layers, precision, layout, scaling, cluster, n, status, tps, step_ms,
         mfu_bf16, mfu_own, mem_gib, final_loss, imported) = row
        out[exp_id].append(RunPoint(
            run_id=run_id, model=model, num_layers=num_layers, precision=precision, layout=layout,
            scaling=scaling, cluster=cluster, num_devices=n, status=status, tokens_per_sec=tps,
            step_ms_median=step_ms, mfu_vs_bf16_peak=mfu_bf16, mfu_vs_precision_peak=mfu_own,
            peak_memory_allocated_gib=mem_gib, final_loss=final_loss, imported=imported))
    return out


def load_run_points(session: Session, experiment_id: int) -> list[RunPoint]:
    return load_run_points_many(session, [experiment_id])[experiment_id]


# ------------------------------------------------------------------------------------------ fingerprint


def fingerprints(session: Session, experiment_ids: Sequence[int]) -> dict[int, str]:
    """A short hash that changes whenever anything a reader of these experiments sees can change.

    Runs change only through UPDATEs that move status, attempts, cancel_requested, dispatched_at,
    started_at, finished_at or the Slurm job id (results and step metrics are written with finished_at),
    so per-status counts plus those maxima and sums catch every visible change. Heartbeats are left out on
    purpose: they move every few seconds and nothing shown depends on them. Ids that do not exist are
    absent from the answer.
    """
    r = Run
    stmt = (
        sa.select(
            Experiment.id,
            Experiment.created_at,
            r.status,
            sa.func.count(r.id),
            sa.func.max(r.id),
            sa.func.sum(r.attempts),
            sa.func.sum(sa.case((r.cancel_requested, 1), else_=0)),
            sa.func.count(r.dispatched_at),
            sa.func.count(r.slurm_job_id),
            sa.func.max(r.dispatched_at),
            sa.func.max(r.started_at),
            sa.func.max(r.finished_at),
        )
        .outerjoin(r, r.experiment_id == Experiment.id)
        .where(Experiment.id.in_(list(experiment_ids)))
        .group_by(Experiment.id, Experiment.created_at, r.status)  # created_at: an id reused after a reset
    )
    parts: dict[int, list[str]] = {}
    for exp_id, *rest in session.execute(stmt):
        parts.setdefault(exp_id, []).append("|".join(str(v) for v in rest))
    return {i: hashlib.blake2b("\n".join(sorted(p)).encode(), digest_size=12).hexdigest() for i, p in parts.items()}


def fingerprint(session: Session, experiment_id: int) -> str | None:
    """The fingerprint of one experiment, or None when it does not exist."""
    return fingerprints(session, [experiment_id]).get(experiment_id)


# ----------------------------------------------------------------------------------------- loss curves


@dataclass(frozen=True)
class LossCurve:
    run_id: int
    cluster: str
    precision: str
    layout: str
    num_devices: int
    repeat: int
    num_steps: int  # steps with a loss, before thinning
    steps: list[int]
    losses: list[float]


def _curve_runs(session: Session, experiment_id: int, num_devices: int | None) -> list[sa.Row]:
    """One succeeded run per (cluster, precision, layout, N): the lowest repeat (then the lowest id)."""
    stmt = (
        sa.select(Run.id, Run.cluster, Run.precision, Run.layout, Run.num_devices, Run.repeat)
        .where(Run.experiment_id == experiment_id, Run.status == "succeeded")
        .order_by(Run.repeat, Run.id)
    )
    if num_devices is not None:
        stmt = stmt.where(Run.num_devices == num_devices)
    chosen: dict[tuple, sa.Row] = {}
    for row in session.execute(stmt):
        chosen.setdefault((row.cluster, row.precision, row.layout, row.num_devices), row)
    return sorted(chosen.values(), key=lambda r: (r.cluster, r.layout, r.num_devices, r.precision))


def _thinned_steps(session: Session, run_ids: list[int], max_points: int) -> dict[int, tuple[int, list, list]]:
    """Steps with a loss, thinned to <= max_points per run: every k-th from the first, plus the last
    (k = ceil((n - 1) / (max_points - 1)), so that both ends are kept); n per run too."""
    base = (
        sa.select(
            StepMetric.run_id,
            StepMetric.step,
            StepMetric.loss,
            sa.func.row_number().over(partition_by=StepMetric.run_id, order_by=StepMetric.step).label("rn"),
            sa.func.count().over(partition_by=StepMetric.run_id).label("n"),
        )
        .where(StepMetric.run_id.in_(run_ids), StepMetric.loss.is_not(None))
        .subquery()
    )
    m = max_points
    stride = sa.case((base.c.n <= m, 1), else_=(base.c.n + (m - 3)) // (m - 1))  # ceil((n - 1) / (m - 1))
    stmt = (
        sa.select(base.c.run_id, base.c.step, base.c.loss, base.c.n)
        .where(sa.or_((base.c.rn - 1) % stride == 0, base.c.rn == base.c.n))
        .order_by(base.c.run_id, base.c.step)
    )
    out: dict[int, tuple[int, list, list]] = {}
    for run_id, step, loss, n in session.execute(stmt):
        entry = out.setdefault(run_id, (n, [], []))
        entry[1].append(step)
        entry[2].append(loss)
    return out


def loss_curves(
    session: Session, experiment_id: int, *, max_points: int = 200, num_devices: int | None = None
) -> list[LossCurve]:
    """Loss curves for the fp8-vs-bf16 chart: one run per (cluster, precision, layout, N), each thinned to
    at most max_points points (first and last step kept). Runs without step losses give no curve."""
    assert max_points >= 2
    runs = _curve_runs(session, experiment_id, num_devices)
    if not runs:
        return []
    steps = _thinned_steps(session, [r.id for r in runs], max_points)
    return [
        LossCurve(
            run_id=r.id,
            cluster=r.cluster,
            precision=r.precision,
            layout=r.layout,
            num_devices=r.num_devices,
            repeat=r.repeat,
            num_steps=steps[r.id][0],
            steps=steps[r.id][1],
            losses=steps[r.id][2],
        )
        for r in runs
        if r.id in steps
    ]
