"""Analysis reads: scaling points aggregated per (series, N), change fingerprints for ETags, loss curves.

Each function is a bounded number of queries whatever the experiment's size (no N+1), and none reads
step_metrics for a run recorded since loss curves are stored (record_result stores them):
  load_scaling_points  1 query  (PostgreSQL: an index-only GROUP BY, one row per (series, N), not per run),
                       + 1 when points changed (their summary medians, aggregated in the database)
  load_run_points      1 query  (one RunPoint per run, series key from the spec JSON: the per-run reading,
                       what SQLite uses and what the aggregated reading is tested against)
  fingerprints         1 query  (per-status counts and max timestamps; no step_metrics scan)
  loss_curves          2 queries (every succeeded run with its seed and held-out curve, then the stored
                       curves), + 1 for runs stored before curves were (their steps thinned in SQL)
  load_run_digests     1 query (the named runs' curve digests), + 1 for curves stored before digests were
                       (digested on the fly); a report asks only for the pairs its cache lacks
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from array import array
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnExpressionArgument
from sqlalchemy.sql.compiler import SQLCompiler

from core.analysis.curves import DIGEST_VERSION, CurveDigest, digest_curve
from core.analysis.numerics import RunLosses
from core.analysis.scaling import PointRuns, PointValues, RunPoint, SeriesKey, aggregate_points
from core.contracts.specs import FP8_PRECISIONS
from db.models import Experiment, Run, RunLossCurve, RunSummary, StepMetric

# Cancelled runs are left out of the curves: the point they belonged to shows as missing (nothing was
# measured), not as a failure of the configuration and not as pending forever.
EXCLUDED_FROM_CURVES = ("cancelled",)


class _final_loss(sa.sql.expression.FunctionElement[float]):
    """runs.result -> numerics.final_loss. On SQLite a result JSON that is not valid (Infinity or NaN written
    before JSON columns were strict) reads as NULL instead of failing the whole query ("malformed JSON")."""

    type = sa.Float()
    inherit_cache = True


@compiles(_final_loss)
def _final_loss_default(element: _final_loss, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(Run.result[("numerics", "final_loss")].as_float(), **kw)


@compiles(_final_loss, "sqlite")
def _final_loss_sqlite(element: _final_loss, compiler: SQLCompiler, **kw: Any) -> str:
    valid = compiler.process(sa.func.json_valid(Run.result), **kw)
    return f"CASE WHEN {valid} THEN {_final_loss_default(element, compiler, **kw)} END"


def _run_point_select() -> sa.Select[*tuple[Any, ...]]:
    spec = Run.spec
    return (
        sa.select(
            Run.experiment_id,
            Run.id,
            spec["model"].as_string(),
            spec["num_layers"].as_integer(),
            Run.precision,
            Run.layout,
            spec["scaling"].as_string(),
            Run.cluster,
            Run.num_devices,
            Run.status,
            RunSummary.tokens_per_sec,
            RunSummary.step_ms_median,
            RunSummary.mfu_vs_bf16_peak,
            RunSummary.mfu_vs_precision_peak,
            RunSummary.peak_memory_allocated_gib,
            _final_loss(),
            Run.imported,
            Run.engine,
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
        (
            exp_id,
            run_id,
            model,
            num_layers,
            precision,
            layout,
            scaling,
            cluster,
            n,
            status,
            tps,
            step_ms,
            mfu_bf16,
            mfu_own,
            mem_gib,
            final_loss,
            imported,
            engine,
        ) = row
        out[exp_id].append(
            RunPoint(
                run_id=run_id,
                model=model,
                num_layers=num_layers,
                precision=precision,
                layout=layout,
                scaling=scaling,
                cluster=cluster,
                num_devices=n,
                status=status,
                tokens_per_sec=tps,
                step_ms_median=step_ms,
                mfu_vs_bf16_peak=mfu_bf16,
                mfu_vs_precision_peak=mfu_own,
                peak_memory_allocated_gib=mem_gib,
                final_loss=final_loss,
                imported=imported,
                engine=engine,
            )
        )
    return out


def load_run_points(session: Session, experiment_id: int) -> list[RunPoint]:
    return load_run_points_many(session, [experiment_id])[experiment_id]


# ------------------------------------------------------------------------------------ scaling points

_POINT = (Run.engine, Run.model, Run.num_layers, Run.precision, Run.layout, Run.scaling, Run.cluster, Run.num_devices)
_NUM_POINT = len(_POINT)


NO_VALUES = PointValues()


def _point_index_select() -> sa.Select[*tuple[Any, ...]]:
    """One row per (experiment, series, N) from the runs alone: counts, ordered run ids, and the
    fingerprint of the succeeded runs (count, sum of ids, latest finish). Served by an index-only scan
    of ix_runs_scaling_points, already in group order: no sort, no heap, no JSON."""
    succeeded = Run.status == "succeeded"
    return (
        sa.select(
            Run.experiment_id,
            *_POINT,
            sa.func.count(sa.case((Run.status == "failed", 1))),
            sa.func.count(),
            sa.func.array_agg(aggregate_order_by(Run.id, Run.id)),
            sa.func.bool_or(Run.imported),
            sa.func.count(sa.case((succeeded, 1))),
            sa.func.sum(sa.case((succeeded, Run.id))),
            sa.func.max(sa.case((succeeded, Run.finished_at))),
        )
        .where(
            Run.experiment_id.in_(sa.bindparam("experiment_ids", expanding=True)),
            Run.status.not_in(EXCLUDED_FROM_CURVES),
        )
        .group_by(Run.experiment_id, *_POINT)
        .order_by(Run.experiment_id, sa.func.min(Run.id))  # series in order of their first run
    )


def _point_values_select() -> sa.Select[*tuple[Any, ...]]:
    """PointValues per (series, N) of one experiment, over its succeeded runs with a throughput.

    A median is the mean of the two middle values, percentile_disc(0.5) in ascending and in descending
    order (the same value when the count is odd): exactly what statistics.median returns, so the numbers
    equal those of core.analysis.scaling.aggregate_points bit for bit (ordered-set aggregates skip NULLs, as the
    Python medians skip None)."""

    def middle(col: sa.ColumnElement[Any]) -> tuple[sa.ColumnElement[Any], sa.ColumnElement[Any]]:
        return (
            sa.func.percentile_disc(0.5).within_group(col.asc()),
            sa.func.percentile_disc(0.5).within_group(col.desc()),
        )

    # final_loss: the summary's copy; the result JSON only for summaries stored without it (imports)
    final_loss = sa.func.coalesce(RunSummary.final_loss, Run.result[("numerics", "final_loss")].as_float())
    tps = RunSummary.tokens_per_sec
    # usable: finite and positive (NaN sorts above Infinity in PostgreSQL); the others count as invalid
    usable = sa.and_(tps > 0, tps < float("inf"))

    # the value of a usable run, else NULL (skipped)
    def ok(col: ColumnExpressionArgument[Any] | int) -> sa.ColumnElement[Any]:
        return sa.case((usable, col))

    return (
        sa.select(
            *_POINT,
            sa.func.count(ok(1)),
            sa.func.min(ok(tps)),
            sa.func.max(ok(tps)),
            *middle(ok(tps)),
            *middle(ok(RunSummary.step_ms_median)),
            *middle(ok(RunSummary.mfu_vs_bf16_peak)),
            *middle(ok(RunSummary.mfu_vs_precision_peak)),
            *middle(ok(RunSummary.peak_memory_allocated_gib)),
            *middle(ok(final_loss)),
            sa.func.count(),
        )
        .join(RunSummary, RunSummary.run_id == Run.id)
        .where(Run.experiment_id == sa.bindparam("experiment_id"), Run.status == "succeeded", tps.is_not(None))
        .group_by(*_POINT)
    )


_POINT_INDEX = _point_index_select()
_POINT_VALUES = _point_values_select()


def _mean(lo: float | None, hi: float | None) -> float | None:
    return None if lo is None or hi is None else (lo + hi) / 2


def _point_values(
    session: Session, experiment_id: int, points: list[tuple[Any, ...]] | None
) -> dict[tuple[Any, ...], PointValues]:
    """PointValues of these points ((engine, model, layers, precision, layout, scaling, cluster, N) tuples) of one
    experiment; None: of all its points."""
    stmt = _POINT_VALUES if points is None else _POINT_VALUES.where(sa.tuple_(*_POINT).in_(points))
    out = {}
    for row in session.execute(stmt, {"experiment_id": experiment_id}):
        num_ok, x_min, x_max, *middles, num_with_tps = row[len(_POINT) :]
        x, step_ms, mfu_bf16, mfu_own, mem_gib, final_loss = (_mean(*middles[i : i + 2]) for i in range(0, 12, 2))
        out[tuple(row[: len(_POINT)])] = PointValues(
            num_succeeded=num_ok,
            num_invalid=num_with_tps - num_ok,
            tokens_per_sec=x,
            tokens_per_sec_min=x_min,
            tokens_per_sec_max=x_max,
            step_ms_median=step_ms,
            mfu_vs_bf16_peak=mfu_bf16,
            mfu_vs_precision_peak=mfu_own,
            peak_memory_allocated_gib=mem_gib,
            final_loss=final_loss,
        )
    return out


def load_scaling_points_many(
    session: Session, experiment_ids: Sequence[int], known: MutableMapping[tuple[Any, ...], PointValues] | None = None
) -> dict[int, list[PointRuns]]:
    """The PointRuns of several experiments (core.analysis.scaling.build_report_from_points' input), keyed by id.

    PostgreSQL: one index-only GROUP BY gives every point's counts, run ids and the fingerprint of its
    succeeded runs; the summary values (medians) are aggregated by the database only for points whose
    fingerprint is not in `known` (a cache the caller keeps; filled here). A succeeded run is terminal and
    its summary written once with it, so a point's values change only when its succeeded runs do: after
    one run finished, one point is re-aggregated. Other databases (SQLite, the embedded default) aggregate
    the per-run rows in Python, which gives the same records."""
    if session.get_bind().dialect.name != "postgresql":
        return {i: aggregate_points(rs) for i, rs in load_run_points_many(session, experiment_ids).items()}
    known = {} if known is None else known
    index = session.execute(_POINT_INDEX, {"experiment_ids": list(experiment_ids)}).all()
    # (experiment, point, succeeded count, sum of their ids, latest finish); None: no succeeded run
    fps = [(row[0], *row[1 : 1 + _NUM_POINT], *row[-3:]) if row[-3] else None for row in index]
    wanted: dict[int, dict[tuple[Any, ...], tuple[Any, ...]]] = {}  # experiment -> point -> its fingerprint
    for row, fp in zip(index, fps):
        if fp is not None and fp not in known:
            wanted.setdefault(row[0], {})[tuple(row[1 : 1 + _NUM_POINT])] = fp
    for exp_id, points in wanted.items():
        num_points = sum(row[0] == exp_id for row in index)
        found = _point_values(session, exp_id, None if len(points) > num_points // 2 else list(points))
        for point, fp in points.items():
            known[fp] = found.get(point, NO_VALUES)
    out: dict[int, list[PointRuns]] = {i: [] for i in experiment_ids}
    keys: dict[tuple[Any, ...], SeriesKey] = {}
    for row, fp in zip(index, fps):
        out[row[0]].append(_point_runs(row, known.get(fp, NO_VALUES) if fp is not None else NO_VALUES, keys))
    return out


def _point_runs(row: sa.Row[*tuple[Any, ...]], v: PointValues, keys: dict[tuple[Any, ...], SeriesKey]) -> PointRuns:
    (_, engine, model, num_layers, precision, layout, scaling, cluster, n, num_failed, num_runs, run_ids, imported) = (
        row[:13]
    )
    raw = (engine, model, num_layers, precision, layout, scaling, cluster)
    key = keys.get(raw) or keys.setdefault(
        raw,
        SeriesKey(
            engine=engine,
            model=model,
            num_layers=num_layers,
            precision=precision,
            layout=layout,
            scaling=scaling,
            cluster=cluster,
        ),
    )
    num_failed += v.num_invalid  # a succeeded run with an unusable stored throughput measured nothing
    values = {f.name: getattr(v, f.name) for f in dataclasses.fields(PointValues)}
    return PointRuns(
        key=key,
        num_devices=n,
        num_failed=num_failed,
        num_pending=num_runs - v.num_succeeded - num_failed,
        run_ids=tuple(map(str, run_ids)),
        imported=imported,
        **values,
    )


def load_scaling_points(
    session: Session, experiment_id: int, known: MutableMapping[tuple[Any, ...], PointValues] | None = None
) -> list[PointRuns]:
    return load_scaling_points_many(session, [experiment_id], known)[experiment_id]


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


# A stored curve holds at most this many points (= the most a /losses request may ask per curve), so a
# curve of up to 2,000 steps is stored whole and served exactly as thinning its steps would serve it.
STORED_CURVE_POINTS = 2000
DOWNSAMPLING = (
    "every k-th point from the first, plus the last, k = ceil((n - 1) / (max_points - 1)) over the n points "
    "thinned; a curve longer than 2000 points is stored thinned that way to 2000 points when its run is "
    "recorded (stored_stride > 1) and served by thinning the stored points"
)


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
    source: str = "store"  # store: the curve stored when the run was recorded; steps: thinned from step rows
    stored_stride: int = 1  # the stored curve keeps every stored_stride-th step (1: all of them)
    engine: str = "scalebench"
    seed: int = 0
    eval_steps: list[int] = dataclasses.field(default_factory=list)  # held-out loss after these steps (thinned)
    eval_losses: list[float | None] = dataclasses.field(default_factory=list)


def _stride(n: int, max_points: int) -> int:
    return 1 if n <= max_points else (n + max_points - 3) // (max_points - 1)  # ceil((n - 1) / (max_points - 1))


def _thin(values: list[Any], max_points: int) -> list[Any]:
    """Every k-th value from the first, plus the last (the rule of _thinned_steps, applied in Python)."""
    k = _stride(len(values), max_points)
    kept = values[::k]
    if (len(values) - 1) % k:
        kept.append(values[-1])
    return kept


def _packed(typecode: str, values: list[Any]) -> bytes:
    a = array(typecode, values)
    if sys.byteorder == "big":  # stored little-endian
        a.byteswap()
    return a.tobytes()


def _unpacked(typecode: str, raw: bytes) -> list[Any]:
    a = array(typecode)
    a.frombytes(raw)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()


def pack_digest(d: CurveDigest) -> bytes:
    """A CurveDigest as float64s: version, num_steps, bins, evals, then its tuples in field order."""
    nb, ne = len(d.bin_steps), len(d.eval_steps)
    head = [float(DIGEST_VERSION), float(d.num_steps), float(nb), float(ne)]
    return _packed("d", head + [*d.bin_steps, *d.bin_losses, *d.bin_sds, *d.bin_counts, *d.eval_steps, *d.eval_losses])


def unpack_digest(raw: bytes, run_id: str, seed: int) -> CurveDigest | None:
    """The digest of pack_digest (None for another version: it is then digested again from the curve)."""
    v = _unpacked("d", raw)
    if len(v) < 4 or v[0] != DIGEST_VERSION:
        return None
    nb, ne = int(v[2]), int(v[3])
    o = 4
    cut = [o + i * nb for i in range(5)] + [o + 4 * nb + ne, o + 4 * nb + 2 * ne]
    return CurveDigest(
        run_id=run_id,
        seed=seed,
        num_steps=int(v[1]),
        bin_steps=tuple(v[cut[0] : cut[1]]),
        bin_losses=tuple(v[cut[1] : cut[2]]),
        bin_sds=tuple(v[cut[2] : cut[3]]),
        bin_counts=tuple(int(c) for c in v[cut[3] : cut[4]]),
        eval_steps=tuple(int(s) for s in v[cut[4] : cut[5]]),
        eval_losses=tuple(v[cut[5] : cut[6]]),
    )


def loss_curve_row(
    run_id: int, points: Sequence[tuple[int, float]], eval_points: Sequence[tuple[int, float | None]] = ()
) -> dict[str, Any]:
    """The run_loss_curves row of a run's (step, loss) points (any order, at least one; None losses left
    out): thinned to at most STORED_CURVE_POINTS, arrays packed, and the digest of every point and of the
    held-out (step, loss) points (core.analysis.curves.digest_curve)."""
    ordered = sorted(points)
    kept = _thin(ordered, STORED_CURVE_POINTS)
    return dict(
        run_id=run_id,
        num_steps=len(ordered),
        stride=_stride(len(ordered), STORED_CURVE_POINTS),
        steps_i64=_packed("q", [s for s, _ in kept]),
        losses_f64=_packed("d", [v for _, v in kept]),
        digest_f64=pack_digest(digest_curve(ordered, eval_points)),
    )


def store_loss_curve(
    session: Session,
    run_id: int,
    points: Sequence[tuple[int, float]],
    eval_points: Sequence[tuple[int, float | None]] = (),
) -> None:
    """Store (replace) a run's loss curve and its digest (with the held-out points, when measured); nothing is
    stored for a run without losses."""
    session.execute(sa.delete(RunLossCurve).where(RunLossCurve.run_id == run_id))
    if points:
        session.execute(sa.insert(RunLossCurve).values(**loss_curve_row(run_id, points, eval_points)))


def _curve_runs(session: Session, experiment_id: int, num_devices: int | None) -> list[sa.Row[*tuple[Any, ...]]]:
    """Every succeeded run of the experiment (at N = num_devices when given) with its seed and held-out curve,
    ordered by engine (scalebench first), cluster, layout, N, precision, seed, repeat."""
    where = [Run.experiment_id == experiment_id, Run.status == "succeeded"]
    if num_devices is not None:
        where.append(Run.num_devices == num_devices)
    rows = session.execute(
        sa.select(
            Run.id,
            Run.engine,
            Run.cluster,
            Run.precision,
            Run.layout,
            Run.num_devices,
            Run.seed,
            Run.repeat,
            _eval_curve_column(session.get_bind().dialect.name).label("eval_curve"),
        ).where(*where)
    ).all()
    return sorted(
        rows,
        key=lambda r: (
            r.engine != "scalebench",
            r.engine,
            r.cluster,
            r.layout,
            r.num_devices,
            r.precision,
            r.seed or 0,
            r.repeat,
            r.id,
        ),
    )


def _thinned_steps(
    session: Session, run_ids: list[int], max_points: int
) -> dict[int, tuple[int, list[Any], list[Any]]]:
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
    out: dict[int, tuple[int, list[Any], list[Any]]] = {}
    for run_id, step, loss, n in session.execute(stmt):
        entry = out.setdefault(run_id, (n, [], []))
        entry[1].append(step)
        entry[2].append(loss)
    return out


def loss_curves(
    session: Session,
    experiment_id: int,
    *,
    max_points: int = 200,
    num_devices: int | None = None,
    every_repeat: bool = True,
) -> list[LossCurve]:
    """Loss curves for the fp8-vs-bf16 chart: every succeeded run's (each seed and repeat, with its engine and
    seed), each thinned to at most max_points points (first and last step kept; DOWNSAMPLING), with its
    held-out curve thinned the same way; every_repeat False: the first repeat of each seed only (one curve per
    point and seed). Runs without step losses give no curve. Stored curves are read as they are; runs without
    one (recorded before curves were stored) are thinned from their steps."""
    assert max_points >= 2
    runs = _curve_runs(session, experiment_id, num_devices)
    if not every_repeat:
        first: dict[tuple[Any, ...], sa.Row[*tuple[Any, ...]]] = {}
        for r in runs:  # ordered by repeat within a point and seed
            first.setdefault((r.engine, r.cluster, r.precision, r.layout, r.num_devices, r.seed or 0), r)
        runs = list(first.values())
    if not runs:
        return []
    ids = [r.id for r in runs]
    stored = {c.run_id: c for c in session.scalars(sa.select(RunLossCurve).where(RunLossCurve.run_id.in_(ids)))}
    unstored = [i for i in ids if i not in stored]
    from_steps = _thinned_steps(session, unstored, max_points) if unstored else {}
    out = []
    for r in runs:
        where = dict(
            run_id=r.id,
            cluster=r.cluster,
            precision=r.precision,
            layout=r.layout,
            num_devices=r.num_devices,
            repeat=r.repeat,
            engine=r.engine,
            seed=r.seed or 0,
            **_thinned_evals(r.eval_curve, max_points),
        )
        if (c := stored.get(r.id)) is not None:
            out.append(
                LossCurve(
                    **where,
                    num_steps=c.num_steps,
                    steps=_thin(_unpacked("q", c.steps_i64), max_points),
                    losses=_thin(_unpacked("d", c.losses_f64), max_points),
                    stored_stride=c.stride,
                )
            )
        elif r.id in from_steps:
            n, steps, losses = from_steps[r.id]
            out.append(LossCurve(**where, num_steps=n, steps=steps, losses=losses, source="steps"))
    return out


def _thinned_evals(raw: Any, max_points: int) -> dict[str, list[Any]]:
    steps, losses = _eval_points(raw)
    return {"eval_steps": _thin(list(steps), max_points), "eval_losses": _thin(list(losses), max_points)}


# ------------------------------------------------------------------------------- loss verdict inputs


def _eval_curve_column(dialect: str) -> sa.ColumnElement[Any]:
    """runs.result -> numerics.eval_curve (JSON). On SQLite a result JSON that is not valid reads as NULL
    (as _final_loss does) instead of failing the query."""
    expr = Run.result[("numerics", "eval_curve")]
    return sa.case((sa.func.json_valid(Run.result), expr)) if dialect == "sqlite" else expr


def _eval_points(raw: Any) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
    if isinstance(raw, str):  # SQLite's CASE returns the JSON text
        raw = json.loads(raw)
    points = [p for p in raw or [] if isinstance(p, dict) and isinstance(p.get("step"), int)]
    return tuple(p["step"] for p in points), tuple(p.get("loss") for p in points)


def load_run_losses_many(session: Session, experiment_ids: Sequence[int]) -> dict[int, dict[str, RunLosses]]:
    """The whole stored loss curves of every succeeded bf16 and fp8 run of these experiments (keyed by
    experiment id then run id, str), with seed and held-out curve. One query. The reports read digests
    (load_run_digests) instead; this is for whoever needs the curves themselves."""
    stmt = (
        sa.select(
            Run.experiment_id,
            Run.id,
            Run.seed,
            RunLossCurve.steps_i64,
            RunLossCurve.losses_f64,
            _eval_curve_column(session.get_bind().dialect.name),
        )
        .join(RunLossCurve, RunLossCurve.run_id == Run.id)
        .where(
            Run.experiment_id.in_(list(experiment_ids)),
            Run.status == "succeeded",
            Run.precision.in_(("bf16", *FP8_PRECISIONS)),
        )
        .order_by(Run.experiment_id, Run.id)
    )
    out: dict[int, dict[str, RunLosses]] = {i: {} for i in experiment_ids}
    for exp_id, run_id, seed, steps_raw, losses_raw, eval_raw in session.execute(stmt):
        eval_steps, eval_losses = _eval_points(eval_raw)
        out[exp_id][str(run_id)] = RunLosses(
            run_id=str(run_id),
            seed=seed or 0,
            steps=tuple(_unpacked("q", steps_raw)),
            losses=tuple(_unpacked("d", losses_raw)),
            eval_steps=eval_steps,
            eval_losses=eval_losses,
        )
    return out


def load_run_losses(session: Session, experiment_id: int) -> dict[str, RunLosses]:
    return load_run_losses_many(session, [experiment_id])[experiment_id]


def _digests_select() -> sa.Select[*tuple[Any, ...]]:
    """Every named succeeded run with a stored curve, and the digest of the first (lowest id) of each seed of each
    point only: the verdict and time to loss compare one run per seed (core.analysis.numerics.first_by_seed), so
    a point of 100 repeats sends one digest per seed, not 100."""
    first = sa.func.row_number().over(partition_by=(Run.experiment_id, *_POINT, Run.seed), order_by=Run.id) == 1
    return (
        sa.select(Run.id, Run.seed, sa.case((first, RunLossCurve.digest_f64)), first)
        .join(RunLossCurve, RunLossCurve.run_id == Run.id)
        .where(Run.id.in_(sa.bindparam("run_ids", expanding=True)), Run.status == "succeeded")
    )


_DIGESTS = _digests_select()


def load_run_digests(session: Session, run_ids: Sequence[int | str]) -> dict[str, CurveDigest]:
    """The curve digests (core.analysis.curves) of these runs, keyed by run id (str): of the succeeded ones with a
    loss curve, the first of each seed of each point (the runs a verdict reads). One query; curves stored
    without a digest (before digests were stored, or of another digest version) are digested here from the
    stored curve and the result's held-out curve (one more query), and succeeded runs without a stored curve
    (imported as step records) from their step losses (two more)."""
    ids = sorted({int(i) for i in run_ids})
    out: dict[str, CurveDigest] = {}
    if not ids:
        return out
    redo, stored = [], set()
    for run_id, seed, raw, first in session.execute(_DIGESTS, {"run_ids": ids}):
        stored.add(run_id)
        if not first:
            continue  # a later run of a seed the report reads the first run of
        d = unpack_digest(raw, str(run_id), seed or 0) if raw is not None else None
        if d is None:
            redo.append(run_id)
        else:
            out[str(run_id)] = d
    if absent := [i for i in ids if i not in stored]:
        out |= _digests_from_steps(session, absent)
    if redo:
        stmt = (
            sa.select(
                Run.id,
                Run.seed,
                RunLossCurve.steps_i64,
                RunLossCurve.losses_f64,
                _eval_curve_column(session.get_bind().dialect.name),
            )
            .join(RunLossCurve, RunLossCurve.run_id == Run.id)
            .where(Run.id.in_(redo))
        )
        for run_id, seed, steps_raw, losses_raw, eval_raw in session.execute(stmt):
            eval_steps, eval_losses = _eval_points(eval_raw)
            points = list(zip(_unpacked("q", steps_raw), _unpacked("d", losses_raw)))
            out[str(run_id)] = digest_curve(
                points, list(zip(eval_steps, eval_losses)), run_id=str(run_id), seed=seed or 0
            )
    return out


def _digests_from_steps(session: Session, run_ids: list[int]) -> dict[str, CurveDigest]:
    """Digests of succeeded runs that have step losses but no stored curve, from their step rows."""
    runs = session.execute(
        sa.select(Run.id, Run.seed, _eval_curve_column(session.get_bind().dialect.name)).where(
            Run.id.in_(run_ids), Run.status == "succeeded"
        )
    ).all()
    if not runs:
        return {}
    points: dict[int, list[tuple[int, float | None]]] = {}  # loss as its column types it (the query skips NULLs)
    stmt = (
        sa.select(StepMetric.run_id, StepMetric.step, StepMetric.loss)
        .where(StepMetric.run_id.in_([r[0] for r in runs]), StepMetric.loss.is_not(None))
        .order_by(StepMetric.run_id, StepMetric.step)
    )
    for run_id, step, loss in session.execute(stmt):
        points.setdefault(run_id, []).append((step, loss))
    out = {}
    for run_id, seed, eval_raw in runs:
        eval_steps, eval_losses = _eval_points(eval_raw)
        if points.get(run_id) or eval_steps:
            out[str(run_id)] = digest_curve(
                points.get(run_id, []), list(zip(eval_steps, eval_losses)), run_id=str(run_id), seed=seed or 0
            )
    return out
