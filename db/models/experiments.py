"""Experiments (one posted matrix, an import or a suite's firing) and their runs, one per matrix point.

Ids are integers. Timestamps are timezone-aware UTC (`UtcDateTime`), also on SQLite, which stores them
naive. JSON columns are JSONB on PostgreSQL (tag containment filters) and JSON elsewhere (db.base).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import Mapped, mapped_column, relationship

from db.base import Base, enum_check, utcnow

EXPERIMENT_SOURCES = ("api", "import", "suite")
RUN_STATUSES = ("queued", "pending", "running", "succeeded", "failed", "cancelled")
ACTIVE_STATUSES = ("pending", "running")  # a worker owns the run
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


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

    runs: Mapped[list[Run]] = relationship(
        back_populates="experiment", passive_deletes=True, order_by="Run.id", lazy="raise_on_sql"
    )


def _from_spec(field: str) -> Callable[[DefaultExecutionContext], Any]:
    """Column default copied from the run's spec JSON at INSERT, so that the scaling series key (model,
    layers, scaling mode) is a plain column: grouping 20,000 runs then reads no JSON."""

    def default(context: DefaultExecutionContext) -> Any:
        return context.get_current_parameters()["spec"][field]

    return default


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        enum_check("status", RUN_STATUSES),
        # INCLUDE: the change fingerprint of an experiment (db.points.fingerprints) by an index-only scan
        sa.Index(
            "ix_runs_experiment_id_status",
            "experiment_id",
            "status",
            postgresql_include=[
                "id",
                "attempts",
                "cancel_requested",
                "dispatched_at",
                "slurm_job_id",
                "started_at",
                "finished_at",
            ],
        ),
        sa.Index("ix_runs_status_dispatched_at", "status", "dispatched_at"),
        sa.Index("ix_runs_queue_status_id", "queue", "status", "id"),  # the oldest claimable run of a queue
        # the scaling points of an experiment in group order, read by an index-only scan (db.points)
        sa.Index(
            "ix_runs_scaling_points",
            "experiment_id",
            "engine",
            "model",
            "num_layers",
            "precision",
            "layout",
            "scaling",
            "cluster",
            "num_devices",
            "id",
            postgresql_include=["status", "imported", "finished_at"],
        ),
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
    # +1 at every claim (re-attaching ones too): the fence a worker names in each write about the run
    lease_id: Mapped[int] = mapped_column(default=0, server_default="0")
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
