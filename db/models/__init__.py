"""SQLAlchemy 2 typed models, one module per resource; every name is re-exported here.

All tables share one MetaData with a constraint naming convention (db.base).
"""

from __future__ import annotations

from db.models.experiments import (
    ACTIVE_STATUSES,
    EXPERIMENT_SOURCES,
    RUN_STATUSES,
    TERMINAL_STATUSES,
    Experiment,
    Run,
)
from db.models.regressions import REGRESSION_STATUSES, Regression
from db.models.runs import (
    RunLog,
    RunLossCurve,
    RunSummary,
    RunTrace,
    StepMetric,
)
from db.models.suites import (
    CONCURRENCY_POLICIES,
    DEFAULT_CONCURRENCY_POLICY,
    DEFAULT_MAX_QUEUED_RUNS,
    DEFAULT_SCHEDULE,
    FIRING_OUTCOMES,
    FIRING_TRIGGERS,
    MAX_FIRINGS_KEPT,
    Suite,
    SuiteEvaluation,
    SuiteFiring,
)
from db.models.tokens import TOKEN_ROLES, ApiToken
from db.models.webhooks import DEFAULT_WEBHOOK_EVENTS, DELIVERY_STATUSES, WEBHOOK_EVENTS, Webhook, WebhookDelivery

__all__ = [
    "ACTIVE_STATUSES",
    "ApiToken",
    "CONCURRENCY_POLICIES",
    "TOKEN_ROLES",
    "DEFAULT_CONCURRENCY_POLICY",
    "DEFAULT_MAX_QUEUED_RUNS",
    "DEFAULT_SCHEDULE",
    "DEFAULT_WEBHOOK_EVENTS",
    "DELIVERY_STATUSES",
    "EXPERIMENT_SOURCES",
    "Experiment",
    "FIRING_OUTCOMES",
    "FIRING_TRIGGERS",
    "MAX_FIRINGS_KEPT",
    "REGRESSION_STATUSES",
    "RUN_STATUSES",
    "Regression",
    "Run",
    "RunLog",
    "RunLossCurve",
    "RunSummary",
    "RunTrace",
    "StepMetric",
    "Suite",
    "SuiteEvaluation",
    "SuiteFiring",
    "TERMINAL_STATUSES",
    "WEBHOOK_EVENTS",
    "Webhook",
    "WebhookDelivery",
]
