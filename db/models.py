"""SQLAlchemy 2 typed models: experiments, runs, per-step metrics, run summaries, run logs and traces, API tokens.

Ids are integers. Timestamps are timezone-aware UTC (`UtcDateTime`), also on SQLite, which stores them
naive. JSON columns are JSONB on PostgreSQL (tag containment filters) and JSON elsewhere (db.base).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from db.base import Base, enum_check, utcnow

EXPERIMENT_SOURCES = ("api", "import", "suite")
RUN_STATUSES = ("queued", "pending", "running", "succeeded", "failed", "cancelled")
ACTIVE_STATUSES = ("pending", "running")  # a worker owns the run
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


def _from_spec(field: str):
    """Column default copied from the run's spec JSON at INSERT, so that the scaling series key (model,
    layers, scaling mode) is a plain column: grouping 20,000 runs then reads no JSON."""

    def default(context: sa.engine.interfaces.ExecutionContext) -> Any:
        return context.get_current_parameters()["spec"][field]

    return default


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (enum_check("source", EXPERIMENT_SOURCES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    cluster: Mapped[str] = mapped_column(sa.String(100), index=True)
    spec: Mapped[dict[str, Any]]  # ExperimentSpec, normalized JSON
    tags: Mapped[list[Any]] = mapped_column(default=list)
    source: Mapped[str] = mapped_column(sa.String(16), default="api")
    suite_id: Mapped[int | None] = mapped_column(index=True)  # FK added with the suites table
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(200), unique=True)
    request_hash: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)

    runs: Mapped[list[Run]] = relationship(back_populates="experiment", passive_deletes=True,
                                           order_by="Run.id", lazy="raise_on_sql")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        enum_check("status", RUN_STATUSES),
        # INCLUDE: the change fingerprint of an experiment (db.analysis.fingerprints) by an index-only scan
        sa.Index("ix_runs_experiment_id_status", "experiment_id", "status",
                 postgresql_include=["id", "attempts", "cancel_requested", "dispatched_at", "slurm_job_id",
                                     "started_at", "finished_at"]),
        sa.Index("ix_runs_status_dispatched_at", "status", "dispatched_at"),
        sa.Index("ix_runs_queue_status_id", "queue", "status", "id"),  # the oldest claimable run of a queue
        # the scaling points of an experiment in group order, read by an index-only scan (db.analysis)
        sa.Index("ix_runs_scaling_points", "experiment_id", "engine", "model", "num_layers", "precision", "layout",
                 "scaling", "cluster", "num_devices", "id", postgresql_include=["status", "imported", "finished_at"]),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(sa.ForeignKey("experiments.id", ondelete="CASCADE"))
    run_key: Mapped[str] = mapped_column(sa.String(64), index=True)
    spec: Mapped[dict[str, Any]]  # RunSpec JSON, what the runner reads as spec.json
    precision: Mapped[str] = mapped_column(sa.String(32))
    layout: Mapped[str] = mapped_column(sa.String(64))
    num_devices: Mapped[int]
    engine: Mapped[str] = mapped_column(sa.String(80), default=_from_spec("engine"), server_default="scalebench")
    seed: Mapped[int] = mapped_column(default=_from_spec("seed"), server_default="0")  # = spec.seed
    model: Mapped[str] = mapped_column(sa.String(32), default=_from_spec("model"))  # = spec.model
    num_layers: Mapped[int] = mapped_column(default=_from_spec("num_layers"))  # = spec.num_layers
    scaling: Mapped[str] = mapped_column(sa.String(16), default=_from_spec("scaling"))  # = spec.scaling
    repeat: Mapped[int] = mapped_column(default=0)
    cluster: Mapped[str] = mapped_column(sa.String(100))
    queue: Mapped[str] = mapped_column(sa.String(100))  # Celery queue of the cluster's workers
    status: Mapped[str] = mapped_column(sa.String(16), default="queued")
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    attempts: Mapped[int] = mapped_column(default=0)
    worker: Mapped[str | None] = mapped_column(sa.String(200))
    host: Mapped[str | None] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    dispatched_at: Mapped[datetime | None]  # when the broker accepted the run's latest message
    num_dispatches: Mapped[int] = mapped_column(default=0, server_default="0")  # messages published for the run
    started_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error_kind: Mapped[str | None] = mapped_column(sa.String(32))
    error_message: Mapped[str | None] = mapped_column(sa.Text)
    run_dir: Mapped[str | None] = mapped_column(sa.String(1000))  # holds spec.json, result.json, log.txt
    slurm_job_id: Mapped[str | None] = mapped_column(sa.String(64))
    imported: Mapped[bool] = mapped_column(default=False)
    result: Mapped[dict[str, Any] | None]  # RunResult without steps (environment, numerics, error)

    experiment: Mapped[Experiment] = relationship(back_populates="runs", lazy="raise_on_sql")


class StepMetric(Base):
    __tablename__ = "step_metrics"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    loss: Mapped[float | None]
    step_ms: Mapped[float | None]
    tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    grad_norm: Mapped[float | None]
    lr: Mapped[float | None]
    warmup: Mapped[bool] = mapped_column(default=False)


class RunSummary(Base):
    """core.specs.Summary as columns (so that curves and regressions are plain SQL reads)."""

    __tablename__ = "run_summaries"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    num_timed_steps: Mapped[int]
    tokens_per_step: Mapped[int] = mapped_column(sa.BigInteger)
    tokens_per_sec: Mapped[float]
    tokens_per_sec_per_device: Mapped[float]
    step_ms_median: Mapped[float]
    step_ms_min: Mapped[float]
    step_ms_max: Mapped[float]
    flops_per_token: Mapped[int] = mapped_column(sa.BigInteger)
    tflops_per_device: Mapped[float]
    bf16_peak_tflops: Mapped[float | None]
    precision_peak_tflops: Mapped[float | None]
    mfu_vs_bf16_peak: Mapped[float | None]
    mfu_vs_precision_peak: Mapped[float | None]
    mfu_note: Mapped[str | None] = mapped_column(sa.Text)
    peak_memory_allocated_gib: Mapped[float | None]
    peak_memory_reserved_gib: Mapped[float | None]
    num_float8_linears: Mapped[int | None]
    step_time_source: Mapped[str | None] = mapped_column(sa.String(120))  # how the engine's step times were taken
    # result.numerics.final_loss, written with the summary (None for rows imported before it existed: the
    # readers fall back to the result JSON then)
    final_loss: Mapped[float | None]


class RunLossCurve(Base):
    """A run's loss curve as recorded, kept ready to serve: the steps with a loss, thinned to at most
    db.analysis.STORED_CURVE_POINTS (every stride-th from the first, plus the last), so that /losses reads
    one row per curve whatever the number of step rows. Arrays are packed little-endian (steps int64,
    losses float64), which keeps the values bit for bit."""

    __tablename__ = "run_loss_curves"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    num_steps: Mapped[int]  # steps with a loss, before thinning
    stride: Mapped[int]  # 1: every step is stored
    steps_i64: Mapped[bytes] = mapped_column(sa.LargeBinary)
    losses_f64: Mapped[bytes] = mapped_column(sa.LargeBinary)


class RunLog(Base):
    """The tail of a run's log (the runner's merged stdout/stderr), shipped by its worker while the run goes
    on and when it ends, so that the API reads it from the store: API, workers and Slurm jobs may not share
    a disk. Capped at db.runs.LOG_STORE_MAX_BYTES (the newest bytes are kept)."""

    __tablename__ = "run_logs"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    text: Mapped[str] = mapped_column(sa.Text)
    log_bytes: Mapped[int] = mapped_column(sa.BigInteger)  # size of the whole log when shipped
    final: Mapped[bool] = mapped_column(default=False)  # shipped after the run ended
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class RunTrace(Base):
    """One rank's torch.profiler trace of a profiled run (chrome-trace JSON, gzipped as the runner wrote it),
    shipped by the worker when the run ends, served by GET /runs/{id}/trace."""

    __tablename__ = "run_traces"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(primary_key=True)
    data_gzip: Mapped[bytes] = mapped_column(sa.LargeBinary)
    gzip_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """Only the sha256 of a token is stored, with its first characters to tell tokens apart in a list."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)  # sha256 hex of the token
    prefix: Mapped[str | None] = mapped_column(sa.String(16))  # None for tokens made before prefixes were kept
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]  # a revoked token authenticates nothing
