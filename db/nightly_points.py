"""Per-night values of every series point of suite experiments (what regression detection compares).

A series point is (run key, cluster): the same resolved RunSpec measured on the same cluster, night after
night. Its metrics come from core.analysis.scaling over the night's whole experiment (so efficiency and the fp8
speedup use the same definitions as the curves):

  tokens_per_sec             X(N), median of the succeeded repeats (global tokens/s)
  efficiency                 E(N) against the series' smallest measured N (absent at N0 itself: always 1)
  fp8_speedup                S(N) = X_fp8(N) / X_bf16(N); fp8 points whose bf16 twin was measured
  peak_memory_allocated_gib  median over repeats (higher is worse)
  fp8_loss_gap               |fp8 - bf16| / bf16 final loss (core.analysis.regression.fp8_loss_gap)
  numerics                   1 when the fp8 loss verdict is `differs`, 0 when `tracks` (absent: inconclusive);
                             a `differs` night is a regression of kind numerics (core.analysis.regression, limit 0.5)
  effective_speedup          S(N) / steps_ratio (core.analysis.time_to_loss); absent when fp8 did not reach bf16's
                             end loss or a curve is missing

Loading is three queries whatever the number of nights (runs LEFT JOIN summaries, experiments, curve digests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.analysis.curves import CurveDigest
from core.analysis.regression import fp8_loss_gap, numerics_value
from core.analysis.scaling import RunPoint, ScalingPoint, SpeedupPoint, build_report
from db.models import Experiment, Run, RunSummary
from db.points import load_run_digests

PointKey = tuple[str, str]  # (run_key, cluster)


@dataclass(frozen=True)
class PointNight:
    experiment_id: int
    timestamp: datetime  # the experiment's creation (the night it was fired)
    run_key: str
    cluster: str
    status: str  # succeeded | failed (points still pending, cancelled or missing are left out)
    run_id: int | None  # a representative run: the first succeeded one, else the first failed one
    environment: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    label: dict[str, Any] = field(default_factory=dict)  # model, num_layers, precision, layout, scaling, N


@dataclass
class _RunRow:
    run: RunPoint
    run_key: str
    environment: dict[str, Any]


def _load_rows(session: Session, experiment_ids: Sequence[int]) -> dict[int, list[_RunRow]]:
    spec = Run.spec
    stmt = (
        sa.select(
            Run.experiment_id,
            Run.id,
            Run.run_key,
            spec["model"].as_string(),
            spec["num_layers"].as_integer(),
            Run.precision,
            Run.layout,
            spec["scaling"].as_string(),
            Run.cluster,
            Run.num_devices,
            Run.status,
            RunSummary.tokens_per_sec,
            RunSummary.peak_memory_allocated_gib,
            Run.result,
        )
        .outerjoin(RunSummary, RunSummary.run_id == Run.id)
        .where(Run.experiment_id.in_(list(experiment_ids)), Run.status != "cancelled")
        .order_by(Run.experiment_id, Run.id)
    )
    out: dict[int, list[_RunRow]] = {i: [] for i in experiment_ids}
    for (
        exp_id,
        run_id,
        run_key,
        model,
        layers,
        precision,
        layout,
        scaling,
        cluster,
        n,
        status,
        tps,
        mem,
        res,
    ) in session.execute(stmt):
        numerics = (res or {}).get("numerics") or {}
        point = RunPoint(
            run_id=run_id,
            model=model,
            num_layers=layers,
            precision=precision,
            layout=layout,
            scaling=scaling,
            cluster=cluster,
            num_devices=n,
            status=status,
            tokens_per_sec=tps,
            peak_memory_allocated_gib=mem,
            final_loss=numerics.get("final_loss"),
        )
        out[exp_id].append(_RunRow(point, run_key, (res or {}).get("environment") or {}))
    return out


def _metrics(
    sp: ScalingPoint,
    baseline_n: int | None,
    loss_gap: float | None,
    numerics: float | None = None,
    effective_speedup: float | None = None,
) -> dict[str, float]:
    values = {
        "tokens_per_sec": sp.tokens_per_sec,
        "fp8_speedup": sp.fp8_speedup,
        "effective_speedup": effective_speedup,
        "peak_memory_allocated_gib": sp.peak_memory_allocated_gib,
        "fp8_loss_gap": loss_gap,
        "numerics": numerics,
        "efficiency": sp.efficiency if sp.num_devices != baseline_n else None,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def _loss_gap(sp: SpeedupPoint) -> float | None:
    return (
        fp8_loss_gap(sp.fp8_final_loss, sp.bf16_final_loss)
        if sp.fp8_final_loss is not None and sp.bf16_final_loss
        else None
    )


def _nights_of(
    exp_id: int, timestamp: datetime, rows: list[_RunRow], run_losses: dict[str, CurveDigest] | None = None
) -> dict[PointKey, PointNight]:
    report = build_report([r.run for r in rows], run_losses=run_losses)
    by_point: dict[tuple[object, ...], tuple[ScalingPoint, int | None]] = {}
    for s in report.series:
        for p in s.points:
            k = s.key  # the fields of `ident` below (RunPoint's engine is the default here)
            by_point[(k.model, k.num_layers, k.precision, k.layout, k.scaling, k.cluster, p.num_devices)] = (
                p,
                s.baseline_num_devices,
            )
    speedups = {
        (sp.model, sp.num_layers, sp.precision, sp.layout, sp.scaling, sp.cluster, sp.num_devices): sp
        for sp in report.speedups
    }
    gaps = {ident: _loss_gap(sp) for ident, sp in speedups.items()}
    verdicts = {ident: numerics_value(sp.loss_verdict) for ident, sp in speedups.items()}
    effective = {ident: sp.effective_speedup for ident, sp in speedups.items()}
    groups: dict[PointKey, list[_RunRow]] = {}
    for r in rows:
        groups.setdefault((r.run_key, r.run.cluster), []).append(r)
    out = {}
    for key, group in groups.items():
        rp = group[0].run
        ident = (rp.model, rp.num_layers, rp.precision, rp.layout, rp.scaling, rp.cluster, rp.num_devices)
        sp, n0 = by_point.get(ident, (None, None))
        if sp is None or sp.status not in ("measured", "failed"):
            continue  # still pending: no verdict on it tonight
        status = "succeeded" if sp.status == "measured" else "failed"
        chosen = next((r for r in group if r.run.status == status), group[0])
        label = dict(zip(("model", "num_layers", "precision", "layout", "scaling", "cluster", "num_devices"), ident))
        out[key] = PointNight(
            experiment_id=exp_id,
            timestamp=timestamp,
            run_key=key[0],
            cluster=key[1],
            status=status,
            run_id=int(chosen.run.run_id),
            environment=chosen.environment,
            metrics=(
                _metrics(sp, n0, gaps.get(ident), verdicts.get(ident), effective.get(ident))
                if status == "succeeded"
                else {}
            ),
            label=label,
        )
    return out


def load_nights(session: Session, experiment_ids: Sequence[int]) -> dict[int, dict[PointKey, PointNight]]:
    """experiment id -> (run key, cluster) -> that night's values of the point (every id present)."""
    ids = list(experiment_ids)
    if not ids:
        return {}
    stamps = {
        i: t for i, t in session.execute(sa.select(Experiment.id, Experiment.created_at).where(Experiment.id.in_(ids)))
    }
    rows = _load_rows(session, ids)
    digests = load_run_digests(session, [r.run.run_id for i in ids for r in rows[i] if r.run.status == "succeeded"])
    return {
        i: _nights_of(
            i, stamps[i], rows[i], {str(r.run.run_id): d for r in rows[i] if (d := digests.get(str(r.run.run_id)))}
        )
        if i in stamps
        else {}
        for i in ids
    }
