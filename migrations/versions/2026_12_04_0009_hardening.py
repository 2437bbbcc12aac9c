"""hardening: a concurrency policy and a queued-run cap per suite, and a record of every suite firing

suites.concurrency_policy (skip | queue | replace, default skip) says what a scheduled firing does while an
earlier firing of the suite has unfinished runs; suites.max_queued_runs caps the suite's queued runs (a firing
is skipped at the cap). suite_firings records each firing: the experiment it created, or why it was skipped or
failed, and how many runs of earlier firings it cancelled. Existing suites get the defaults.

Revision ID: 0009_hardening
Revises: 0008_engines
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_hardening"
down_revision: str | Sequence[str] | None = "0008_engines"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POLICY_CHECK = "concurrency_policy IN ('skip', 'queue', 'replace')"


def upgrade() -> None:
    # Plain ADD COLUMNs: a batch table copy of `suites` on SQLite would cascade-delete its regressions and
    # evaluations. SQLite takes the CHECK inline with the column; PostgreSQL as a named constraint.
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE suites ADD COLUMN concurrency_policy VARCHAR(16) DEFAULT 'skip' NOT NULL "
            f"CONSTRAINT ck_suites_concurrency_policy_allowed CHECK ({_POLICY_CHECK})"
        )
    else:
        op.add_column(
            "suites", sa.Column("concurrency_policy", sa.String(length=16), server_default="skip", nullable=False)
        )
        op.create_check_constraint(op.f("ck_suites_concurrency_policy_allowed"), "suites", _POLICY_CHECK)
    op.add_column("suites", sa.Column("max_queued_runs", sa.Integer(), server_default="200", nullable=False))
    op.create_table(
        "suite_firings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite_id", sa.Integer(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("num_runs", sa.Integer(), nullable=False),
        sa.Column("num_cancelled", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("outcome IN ('fired', 'skipped', 'failed')", name=op.f("ck_suite_firings_outcome_allowed")),
        sa.CheckConstraint("trigger IN ('schedule', 'manual')", name=op.f("ck_suite_firings_trigger_allowed")),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_suite_firings_experiment_id_experiments"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["suite_id"], ["suites.id"], name=op.f("fk_suite_firings_suite_id_suites"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suite_firings")),
    )
    op.create_index("ix_suite_firings_suite_id_id", "suite_firings", ["suite_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_suite_firings_suite_id_id", table_name="suite_firings")
    op.drop_table("suite_firings")
    op.drop_column("suites", "max_queued_runs")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint(op.f("ck_suites_concurrency_policy_allowed"), "suites", type_="check")
    op.drop_column("suites", "concurrency_policy")  # SQLite >= 3.35 drops a column in place (no table copy)
