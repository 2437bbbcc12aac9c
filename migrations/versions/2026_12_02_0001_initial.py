"""initial schema: experiments, runs, step_metrics, run_summaries, api_tokens

Revision ID: 0001
Revises:
Create Date: 2026-12-02 16:16:48.323470
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JSONB on PostgreSQL (containment filters on tags), JSON elsewhere; mirrors db.models.JsonType.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("cluster", sa.String(length=100), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("tags", JSON, nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("suite_id", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('api', 'import', 'suite')", name=op.f("ck_experiments_source_allowed")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_experiments_idempotency_key")),
    )
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_experiments_cluster"), ["cluster"], unique=False)
        batch_op.create_index(batch_op.f("ix_experiments_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_experiments_suite_id"), ["suite_id"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("precision", sa.String(length=32), nullable=False),
        sa.Column("layout", sa.String(length=64), nullable=False),
        sa.Column("num_devices", sa.Integer(), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=100), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("run_dir", sa.String(length=1000), nullable=True),
        sa.Column("slurm_job_id", sa.String(length=64), nullable=True),
        sa.Column("imported", sa.Boolean(), nullable=False),
        sa.Column("result", JSON, nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'pending', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_runs_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name=op.f("fk_runs_experiment_id_experiments"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_experiment_id_status", ["experiment_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_run_key"), ["run_key"], unique=False)
        batch_op.create_index("ix_runs_status_dispatched_at", ["status", "dispatched_at"], unique=False)

    op.create_table(
        "run_summaries",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("num_timed_steps", sa.Integer(), nullable=False),
        sa.Column("tokens_per_step", sa.BigInteger(), nullable=False),
        sa.Column("tokens_per_sec", sa.Double(), nullable=False),
        sa.Column("tokens_per_sec_per_device", sa.Double(), nullable=False),
        sa.Column("step_ms_median", sa.Double(), nullable=False),
        sa.Column("step_ms_min", sa.Double(), nullable=False),
        sa.Column("step_ms_max", sa.Double(), nullable=False),
        sa.Column("flops_per_token", sa.BigInteger(), nullable=False),
        sa.Column("tflops_per_device", sa.Double(), nullable=False),
        sa.Column("bf16_peak_tflops", sa.Double(), nullable=True),
        sa.Column("precision_peak_tflops", sa.Double(), nullable=True),
        sa.Column("mfu_vs_bf16_peak", sa.Double(), nullable=True),
        sa.Column("mfu_vs_precision_peak", sa.Double(), nullable=True),
        sa.Column("mfu_note", sa.Text(), nullable=True),
        sa.Column("peak_memory_allocated_gib", sa.Double(), nullable=True),
        sa.Column("peak_memory_reserved_gib", sa.Double(), nullable=True),
        sa.Column("num_float8_linears", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_summaries_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_summaries")),
    )
    op.create_table(
        "step_metrics",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("step_ms", sa.Double(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("grad_norm", sa.Double(), nullable=True),
        sa.Column("lr", sa.Double(), nullable=True),
        sa.Column("warmup", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_step_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_step_metrics")),
    )


def downgrade() -> None:
    op.drop_table("step_metrics")
    op.drop_table("run_summaries")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_status_dispatched_at")
        batch_op.drop_index(batch_op.f("ix_runs_run_key"))
        batch_op.drop_index("ix_runs_experiment_id_status")

    op.drop_table("runs")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiments_suite_id"))
        batch_op.drop_index(batch_op.f("ix_experiments_created_at"))
        batch_op.drop_index(batch_op.f("ix_experiments_cluster"))

    op.drop_table("experiments")
    op.drop_table("api_tokens")
