"""Request and response schemas of the nightly resources: suites, regressions, webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from core.contracts.specs import ExperimentSpec, Text
from db.models import (
    DEFAULT_CONCURRENCY_POLICY,
    DEFAULT_MAX_QUEUED_RUNS,
    DEFAULT_SCHEDULE,
    DEFAULT_WEBHOOK_EVENTS,
)

NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*$"
RegressionStatus = Literal["suspected", "confirmed", "recovered", "improved", "failed"]
MetricName = Literal[
    "tokens_per_sec",
    "efficiency",
    "fp8_speedup",
    "effective_speedup",
    "peak_memory_allocated_gib",
    "fp8_loss_gap",
    "numerics",
    "run_status",
]
WebhookEvent = Literal[
    "regression.suspected", "regression.confirmed", "regression.failed", "regression.recovered", "regression.improved"
]


ConcurrencyPolicy = Literal["skip", "queue", "replace"]
POLICY_HELP = (
    "What a scheduled firing does while an earlier firing has unfinished runs: skip it (recorded with "
    "the reason), queue it behind them, or replace them (cancel their runs, then fire)."
)
CAP_HELP = "A firing is skipped while this many of the suite's runs are still queued (any policy, manual too)."


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SuiteCreate(_In):
    name: Text = Field(min_length=1, max_length=200, pattern=NO_CONTROL_CHARS, description="Unique suite name.")
    spec: ExperimentSpec = Field(description="The experiment template fired on every run of the schedule.")
    cluster: str | None = Field(
        None, min_length=1, max_length=100, description="Cluster to run on (default: the spec's cluster)."
    )
    schedule: str = Field(
        DEFAULT_SCHEDULE,
        max_length=100,
        description="5-field cron in UTC (minute hour day-of-month month day-of-week), or one of "
        "@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually.",
    )
    enabled: StrictBool = True
    thresholds: dict[str, StrictFloat] = Field(
        {}, description="Per metric: relative threshold (fraction), or the absolute limit for fp8_loss_gap."
    )
    baseline_nights: StrictInt = Field(7, ge=3, le=60, description="K: baseline = median of the last K good nights.")
    concurrency_policy: ConcurrencyPolicy = Field(DEFAULT_CONCURRENCY_POLICY, description=POLICY_HELP)
    max_queued_runs: StrictInt = Field(DEFAULT_MAX_QUEUED_RUNS, ge=1, le=100_000, description=CAP_HELP)


class SuiteUpdate(_In):
    enabled: StrictBool | None = None
    schedule: str | None = Field(None, max_length=100)
    thresholds: dict[str, StrictFloat] | None = None
    baseline_nights: StrictInt | None = Field(None, ge=3, le=60)
    concurrency_policy: ConcurrencyPolicy | None = Field(None, description=POLICY_HELP)
    max_queued_runs: StrictInt | None = Field(None, ge=1, le=100_000, description=CAP_HELP)


class SuiteRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    spec: dict[str, Any]
    cluster: str
    schedule: str
    enabled: bool
    thresholds: dict[str, float]
    effective_thresholds: dict[str, float] = Field({}, description="Thresholds in use (defaults included).")
    baseline_nights: int
    last_fired_at: datetime | None
    next_fire_at: datetime | None
    last_error: str | None
    concurrency_policy: ConcurrencyPolicy
    max_queued_runs: int
    created_at: datetime
    updated_at: datetime


class SuiteFiringRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    suite_id: int
    fired_at: datetime
    trigger: Literal["schedule", "manual"]
    outcome: Literal["fired", "skipped", "failed"]
    experiment_id: int | None
    num_runs: int
    num_cancelled: int = Field(description="Runs of earlier firings cancelled or asked to stop (replace).")
    reason: str | None = Field(description="Why skipped or failed; what was replaced.")


class TriggerRead(BaseModel):
    suite_id: int
    experiment_id: int
    num_runs: int
    dispatched: bool


class RegressionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    suite_id: int
    run_key: str
    cluster: str
    metric: str
    point: dict[str, Any]
    status: RegressionStatus
    is_open: bool = False
    baseline: float | None
    band_low: float | None
    band_high: float | None
    value: float | None
    delta_pct: float | None
    message: str
    likely_cause: list[str] = []
    first_bad_experiment_id: int | None
    first_bad_run_id: int | None
    last_good_run_id: int | None
    latest_experiment_id: int | None
    num_bad_nights: int
    resolution: str | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None
    created_at: datetime
    updated_at: datetime


class RegressionDetail(RegressionRead):
    env_diff: dict[str, Any] | None = Field(None, description="Last good vs first bad run; changed keys first.")
    events: list[dict[str, Any]] = []


class RegressionPage(BaseModel):
    items: list[RegressionRead]
    next_cursor: str | None


class HistoryNight(BaseModel):
    timestamp: datetime
    run_id: int | str | None
    status: str
    value: float | None
    flagged: bool
    baseline: float | None
    band_low: float | None
    band_high: float | None
    limit: float | None


class RegressionHistory(BaseModel):
    regression_id: int
    metric: str
    higher_is_better: bool
    nights: list[HistoryNight]


class WebhookCreate(_In):
    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=NO_CONTROL_CHARS,
        description="http(s) URL of a public address (no loopback, link-local, private, unspecified "
        "or multicast address, no credentials); private receivers need "
        "SCALEBENCH_WEBHOOK_ALLOW_PRIVATE=1 on the server.",
    )
    secret: str | None = Field(
        None, min_length=16, max_length=200, description="HMAC-SHA256 key; generated when absent (shown once)."
    )
    events: list[WebhookEvent] = Field(list(DEFAULT_WEBHOOK_EVENTS), min_length=1)
    enabled: StrictBool = True


class WebhookUpdate(_In):
    enabled: StrictBool | None = Field(None, description="false: stop sending (pending deliveries end as failed).")
    events: list[WebhookEvent] | None = Field(None, min_length=1)


class WebhookRead(BaseModel):
    id: int
    url: str = Field(
        description="Redacted: scheme, host and port only. A webhook URL often is a credential "
        "(its path or query), so it is never returned, nor is the secret."
    )
    host: str
    events: list[str]
    enabled: bool
    created_at: datetime


class WebhookCreated(WebhookRead):
    secret: str = Field(description="Shown only in this response. Verify X-Scalebench-Signature with it.")


class DeliveryRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    webhook_id: int
    regression_id: int | None
    event: str
    status: Literal["pending", "delivered", "failed"]
    attempt: int
    status_code: int | None
    error: str | None = Field(
        description="A short status line of the last failed attempt (HTTP status, error "
        "class, or why the target was refused); never the receiver's answer."
    )
    attempts_log: list[dict[str, Any]]
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    created_at: datetime
