"""nightly: suites, suite_evaluations, regressions, webhooks, webhook_deliveries

Revision ID: 0002_nightly
Revises: 0001
Create Date: 2026-12-02 16:22:18.707808
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002_nightly"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JSONB on PostgreSQL, JSON elsewhere; mirrors db.models.JsonType.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "suites",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("cluster", sa.String(length=100), nullable=False),
        sa.Column("schedule", sa.String(length=100), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("thresholds", JSON, nullable=False),
        sa.Column("baseline_nights", sa.Integer(), nullable=False),
        sa.Column("last_fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suites")),
        sa.UniqueConstraint("name", name=op.f("uq_suites_name")),
    )
    with op.batch_alter_table("suites", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_suites_next_fire_at"), ["next_fire_at"], unique=False)

    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("secret", sa.String(length=200), nullable=False),
        sa.Column("events", JSON, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_table(
        "suite_evaluations",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("suite_id", sa.Integer(), nullable=False),
        sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("num_points", sa.Integer(), nullable=False),
        sa.Column("num_findings", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_suite_evaluations_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["suite_id"], ["suites.id"], name=op.f("fk_suite_evaluations_suite_id_suites"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_suite_evaluations")),
    )
    with op.batch_alter_table("suite_evaluations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_suite_evaluations_suite_id"), ["suite_id"], unique=False)

    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite_id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("cluster", sa.String(length=100), nullable=False),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("point", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("baseline", sa.Double(), nullable=True),
        sa.Column("band_low", sa.Double(), nullable=True),
        sa.Column("band_high", sa.Double(), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("delta_pct", sa.Double(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("first_bad_experiment_id", sa.Integer(), nullable=True),
        sa.Column("first_bad_run_id", sa.Integer(), nullable=True),
        sa.Column("last_good_run_id", sa.Integer(), nullable=True),
        sa.Column("latest_experiment_id", sa.Integer(), nullable=True),
        sa.Column("env_diff", JSON, nullable=True),
        sa.Column("events", JSON, nullable=False),
        sa.Column("num_bad_nights", sa.Integer(), nullable=False),
        sa.Column("resolution", sa.String(length=16), nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('suspected', 'confirmed', 'recovered', 'improved', 'failed')",
            name=op.f("ck_regressions_status_allowed"),
        ),
        sa.ForeignKeyConstraint(
            ["first_bad_experiment_id"],
            ["experiments.id"],
            name=op.f("fk_regressions_first_bad_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["first_bad_run_id"], ["runs.id"], name=op.f("fk_regressions_first_bad_run_id_runs"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["last_good_run_id"], ["runs.id"], name=op.f("fk_regressions_last_good_run_id_runs"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["latest_experiment_id"],
            ["experiments.id"],
            name=op.f("fk_regressions_latest_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["suite_id"], ["suites.id"], name=op.f("fk_regressions_suite_id_suites"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regressions")),
    )
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_regressions_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_regressions_metric"), ["metric"], unique=False)
        batch_op.create_index("ix_regressions_point", ["suite_id", "run_key", "cluster", "metric"], unique=False)
        batch_op.create_index(batch_op.f("ix_regressions_status"), ["status"], unique=False)

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("regression_id", sa.Integer(), nullable=True),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts_log", JSON, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')", name=op.f("ck_webhook_deliveries_status_allowed")
        ),
        sa.ForeignKeyConstraint(
            ["regression_id"],
            ["regressions.id"],
            name=op.f("fk_webhook_deliveries_regression_id_regressions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["webhook_id"], ["webhooks.id"], name=op.f("fk_webhook_deliveries_webhook_id_webhooks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_webhook_deliveries_status_next_attempt_at", ["status", "next_attempt_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_webhook_deliveries_webhook_id"), ["webhook_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhook_deliveries_webhook_id"))
        batch_op.drop_index("ix_webhook_deliveries_status_next_attempt_at")

    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_regressions_status"))
        batch_op.drop_index("ix_regressions_point")
        batch_op.drop_index(batch_op.f("ix_regressions_metric"))
        batch_op.drop_index(batch_op.f("ix_regressions_created_at"))

    op.drop_table("regressions")
    with op.batch_alter_table("suite_evaluations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_suite_evaluations_suite_id"))

    op.drop_table("suite_evaluations")
    op.drop_table("webhooks")
    with op.batch_alter_table("suites", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_suites_next_fire_at"))

    op.drop_table("suites")
