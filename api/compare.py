"""Side-by-side scaling of several experiments (clusters, software versions) and their ratios.

Each experiment keeps its own report (its own N0). Series match across experiments on their key minus the
cluster (engine, model, layers, precision, layout, scaling); at every N both measured, the ratio is
X_other(N) / X_reference(N), the reference being the first experiment named.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.analysis.scaling import ScalingReport, Series, SpeedupPoint


class CompareExperiment(BaseModel):
    id: int
    name: str
    cluster: str
    source: str
    report: ScalingReport


class CompareRatio(BaseModel):
    engine: str = Field("scalebench", description="The engine of both series (compare matches within an engine).")
    model: str
    num_layers: int
    precision: str
    layout: str
    scaling: str
    num_devices: int
    experiment_id: int
    cluster: str
    reference_experiment_id: int
    reference_cluster: str
    tokens_per_sec: float
    reference_tokens_per_sec: float
    ratio: float = Field(description="tokens_per_sec / reference_tokens_per_sec at the same N (x).")
    efficiency: float | None = None
    reference_efficiency: float | None = None
    steps_ratio: float | None = Field(
        None, description="fp8 series: fp8 steps / bf16 steps to bf16's end loss in this experiment (time to loss)."
    )
    reference_steps_ratio: float | None = None
    effective_speedup: float | None = Field(
        None, description="fp8 series: the speedup at equal loss (speedup / steps_ratio) in this experiment."
    )
    reference_effective_speedup: float | None = None


class CompareRead(BaseModel):
    reference_experiment_id: int
    experiments: list[CompareExperiment]
    ratios: list[CompareRatio]


def _match_key(s: Series) -> tuple[str, str, int, str, str, str]:
    k = s.key
    return (k.engine, k.model, k.num_layers, k.precision, k.layout, k.scaling)


def _speedups(e: CompareExperiment) -> dict[tuple, SpeedupPoint]:
    return {
        (sp.engine, sp.model, sp.num_layers, sp.precision, sp.layout, sp.scaling, sp.cluster, sp.num_devices): sp
        for sp in e.report.speedups
    }


def ratios(reference: CompareExperiment, other: CompareExperiment) -> list[CompareRatio]:
    """X_other(N) / X_reference(N) for every matching series and every N measured in both; fp8 series also
    carry each experiment's time to loss (steps_ratio, effective_speedup)."""
    sp_ref, sp_other = _speedups(reference), _speedups(other)
    ref_series: dict[tuple[str, str, int, str, str, str], list[Series]] = {}
    for s in reference.report.series:
        ref_series.setdefault(_match_key(s), []).append(s)
    out = []
    for s in other.report.series:
        for ref in ref_series.get(_match_key(s), []):
            ref_points = {p.num_devices: p for p in ref.points if p.tokens_per_sec}
            for p in s.points:
                rp = ref_points.get(p.num_devices)
                if not p.tokens_per_sec or rp is None or rp.tokens_per_sec is None:
                    continue
                k = s.key
                mine = sp_other.get((*_match_key(s), k.cluster, p.num_devices))
                theirs = sp_ref.get((*_match_key(ref), ref.key.cluster, p.num_devices))
                out.append(
                    CompareRatio(
                        engine=k.engine,
                        model=k.model,
                        num_layers=k.num_layers,
                        precision=k.precision,
                        layout=k.layout,
                        scaling=k.scaling,
                        num_devices=p.num_devices,
                        experiment_id=other.id,
                        cluster=k.cluster,
                        reference_experiment_id=reference.id,
                        reference_cluster=ref.key.cluster,
                        tokens_per_sec=p.tokens_per_sec,
                        reference_tokens_per_sec=rp.tokens_per_sec,
                        ratio=p.tokens_per_sec / rp.tokens_per_sec,
                        efficiency=p.efficiency,
                        reference_efficiency=rp.efficiency,
                        steps_ratio=mine.steps_ratio if mine else None,
                        reference_steps_ratio=theirs.steps_ratio if theirs else None,
                        effective_speedup=mine.effective_speedup if mine else None,
                        reference_effective_speedup=theirs.effective_speedup if theirs else None,
                    )
                )
    return out


def compare(experiments: list[CompareExperiment]) -> CompareRead:
    assert experiments, "compare needs at least one experiment"
    ref = experiments[0]
    return CompareRead(
        reference_experiment_id=ref.id,
        experiments=experiments,
        ratios=[r for other in experiments[1:] for r in ratios(ref, other)],
    )
