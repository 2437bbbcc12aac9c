"""Expansion of an ExperimentSpec into RunSpecs: engine x precision x layout x N x seed x repeat.

Points that cannot exist are skipped with their reason; a matrix with no valid point is an error that
names every reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.catalog.hardware import unsupported_reason
from core.catalog.shapes import get_shape
from core.contracts import data_paths
from core.contracts.clusters import Cluster
from core.contracts.slurm_layout import layout_reason
from core.contracts.specs import (
    FP8_PRECISIONS,
    MX_PRECISIONS,
    ExperimentSpec,
    ParallelDegrees,
    Precision,
    RunSpec,
    resolve_layout,
)
from core.engines.registry import engine_reason


@dataclass(frozen=True)
class SkippedPoint:
    precision: str
    layout: str
    num_devices: int
    reason: str
    engine: str = "scalebench"


def check_data_path(data_path: str | None, cluster: Cluster, eval_every_steps: int = 0) -> str | None:
    """The spec's data_path relative to the cluster's data roots (None: synthetic). The file itself, and its
    held-out split (<stem>.val) when eval_every_steps > 0, are checked when this machine sees a root (the API next
    to local workers); the runner checks again before reading. core.contracts.data_paths.DataPathError (one message
    for every path that is not allowed; the API answers 422 naming data_path) otherwise."""
    if data_path is None:
        return None
    roots = cluster.data_roots
    if not roots:
        raise data_paths.not_allowed(data_path, roots)
    rel = data_paths.relative_to_roots(data_path, roots)
    if data_paths.roots_visible(roots):
        data_paths.resolve(rel, roots)
        if eval_every_steps > 0:
            held_out = data_paths.beside(rel, ".val")
            try:
                data_paths.resolve(held_out, roots)
            except data_paths.DataPathError as exc:
                raise data_paths.DataPathError(
                    f"data_path {rel!r}: eval_every_steps {eval_every_steps} scores its held-out split "
                    f"{held_out!r}, which is missing (no regular file of that name inside the cluster's data roots: "
                    f"{', '.join(roots)}); build it beside the data file (python -m runner.corpus writes both), "
                    "or set eval_every_steps 0 (no held-out evaluation)"
                ) from exc
    return rel


class MatrixError(ValueError):
    """No valid point in the matrix; `skipped` holds every reason."""

    def __init__(self, skipped: list[SkippedPoint]):
        self.skipped = skipped
        reasons = "; ".join(
            f"{_engine_prefix(s.engine)}{s.precision}/{s.layout}/N={s.num_devices}: {s.reason}" for s in skipped
        )
        super().__init__(f"the matrix has no valid point: {reasons}")


def _engine_prefix(engine: str) -> str:
    return "" if engine == "scalebench" else f"{engine}/"


def _tp_reason(spec: ExperimentSpec, tp: int) -> str | None:
    """Why tensor parallel degree tp cannot split this model as the runner does (heads, FFN, sequence), or None."""
    shape = get_shape(spec.model, spec.num_layers)
    return shape.tp_reason(tp, ffn_hidden_dim=shape.ffn_hidden_dim, seq_len=spec.seq_len)


def _point_reason(spec: ExperimentSpec, cluster: Cluster, precision: str, degrees: ParallelDegrees) -> str | None:
    n = degrees.world_size
    if n > cluster.max_devices:
        return f"N={n} exceeds cluster {cluster.name!r} size ({cluster.max_devices} devices)"
    slurm_reason = layout_reason(cluster, n)  # the rule the Slurm launcher applies: nodes x tasks must split N
    if slurm_reason:
        return slurm_reason
    device_reason = unsupported_reason(precision, cluster.vendor, cluster.device_name)
    if device_reason:
        return device_reason
    if precision in MX_PRECISIONS and degrees.tp > 1:
        return f"{precision} runs without tensor parallelism here (tp={degrees.tp})"
    if spec.fp8_all_gather and precision in FP8_PRECISIONS and precision != "fp8-tensorwise":
        return f"fp8_all_gather works only with fp8-tensorwise, not {precision}"
    if spec.fp8_all_gather and precision == "fp8-tensorwise" and degrees.dp_mode not in ("fsdp", "hsdp"):
        return "fp8_all_gather needs an fsdp or hsdp layout"
    if spec.scaling == "strong" and spec.global_batch_size and spec.global_batch_size % degrees.dp_degree:
        return (
            f"global_batch_size({spec.global_batch_size}) is not divisible by {degrees.dp_degree} data-parallel ranks"
        )
    return _tp_reason(spec, degrees.tp)


def _local_batch(spec: ExperimentSpec, degrees: ParallelDegrees) -> int:
    """Sequences per data-parallel rank: the weak-scaling local batch, or the strong-scaling global one split."""
    if spec.scaling == "strong":
        assert spec.global_batch_size is not None
        return spec.global_batch_size // degrees.dp_degree
    return spec.local_batch_size or 1


def _run_spec(
    spec: ExperimentSpec,
    cluster: Cluster,
    engine: str,
    precision: Precision,
    layout: str,
    degrees: ParallelDegrees,
    seed: int,
    repeat: int,
    data_path: str | None,
) -> RunSpec:
    shape = get_shape(spec.model, spec.num_layers)
    local = _local_batch(spec, degrees)
    fp8_ag = spec.fp8_all_gather and precision == "fp8-tensorwise"
    return RunSpec(
        engine=engine,
        model=spec.model,
        num_layers=shape.num_layers,
        vocab_size=spec.vocab_size,
        precision=precision,
        layout=layout,
        degrees=degrees,
        scaling=spec.scaling,
        seq_len=spec.seq_len,
        local_batch_size=local,
        steps=spec.steps,
        warmup_steps=spec.warmup_steps,
        profile_steps=spec.profile_steps,
        compile=spec.compile,
        activation_checkpointing=spec.activation_checkpointing,
        fp8_all_gather=fp8_ag,
        precompute_fp8_scales=fp8_ag and spec.precompute_fp8_scales,
        lr=spec.lr,
        lr_warmup_steps=spec.lr_warmup_steps,
        lr_schedule=spec.lr_schedule,
        seed=seed,
        data_path=data_path,
        data_roots=list(cluster.data_roots) if data_path else [],
        eval_every_steps=spec.eval_every_steps,
        eval_batches=spec.eval_batches,
        device_type=cluster.device_type,
        timeout_s=spec.timeout_s,
        cluster=cluster.name,
        repeat=repeat,
    )


def expand(spec: ExperimentSpec, cluster: Cluster) -> tuple[list[RunSpec], list[SkippedPoint]]:
    """All runs of the matrix (engine x precision x layout x N x seed x repeat) and the points skipped, with
    reasons."""
    if spec.cluster != cluster.name:
        raise ValueError(f"cluster: spec names {spec.cluster!r} but expansion got {cluster.name!r}")
    # only our runner reads the held-out split (torchtitan refuses eval_every_steps per point)
    held_out_evals = spec.eval_every_steps if "scalebench" in spec.engines else 0
    data_path = check_data_path(spec.data_path, cluster, held_out_evals)
    runs: list[RunSpec] = []
    skipped: list[SkippedPoint] = []
    for engine in spec.engines:
        for precision in spec.precisions:
            for layout in spec.layouts:
                for n in spec.gpu_counts:
                    try:
                        degrees = resolve_layout(layout, n)
                        reason = _point_reason(spec, cluster, precision, degrees) or engine_reason(
                            engine,
                            cluster,
                            precision,
                            layout,
                            degrees,
                            seq_len=spec.seq_len,
                            eval_every_steps=spec.eval_every_steps,
                            num_layers=get_shape(spec.model, spec.num_layers).num_layers,
                            local_batch_size=_local_batch(spec, degrees),
                        )
                    except ValueError as exc:
                        reason = str(exc)
                    if reason:
                        skipped.append(SkippedPoint(precision, layout, n, reason, engine))
                        continue
                    runs.extend(
                        _run_spec(spec, cluster, engine, precision, layout, degrees, seed, r, data_path)
                        for seed in spec.seed_list
                        for r in range(spec.repeats)
                    )
    if not runs:
        raise MatrixError(skipped)
    return runs, skipped
