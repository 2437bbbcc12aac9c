"""What a run records: per-step metrics, its summary, a thinned loss curve, its log and profiler traces."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from db.base import Base, utcnow


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
    """core.contracts.specs.Summary as columns (so that curves and regressions are plain SQL reads)."""

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
    db.points.STORED_CURVE_POINTS (every stride-th from the first, plus the last), so that /losses reads
    one row per curve whatever the number of step rows. Arrays are packed little-endian (steps int64,
    losses float64), which keeps the values bit for bit."""

    __tablename__ = "run_loss_curves"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    num_steps: Mapped[int]  # steps with a loss, before thinning
    stride: Mapped[int]  # 1: every step is stored
    steps_i64: Mapped[bytes] = mapped_column(sa.LargeBinary)
    losses_f64: Mapped[bytes] = mapped_column(sa.LargeBinary)
    # core.analysis.curves.CurveDigest of the training and held-out curves, packed float64 (db.points): what the
    # loss verdict and time to loss read, computed once when the curve is stored. NULL for rows stored before
    # it existed: the readers digest those on the fly.
    digest_f64: Mapped[bytes | None] = mapped_column(sa.LargeBinary)


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
