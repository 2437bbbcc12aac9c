"""Response schemas (XRead) of experiments, runs and clusters, and their builders from db rows.

The request schema is core.contracts.specs.ExperimentSpec."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.problems import FieldError, ProblemError
from core.contracts.clusters import Cluster
from core.contracts.matrix import SkippedPoint
from core.contracts.specs import RunSpec
from core.engines.registry import engine_names
from db.experiments import ExperimentStatus
from db.models import Experiment, Run, RunSummary, StepMetric

RunStatus = Literal["queued", "pending", "running", "succeeded", "failed", "cancelled"]
ExperimentStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class SkippedPointRead(BaseModel):
    engine: str = "scalebench"
    precision: str
    layout: str
    num_devices: int
    reason: str


class RunBrief(BaseModel):
    id: int
    run_key: str = Field(description="Hash of the normalized RunSpec: equal keys are comparable runs.")
    engine: str = Field("scalebench", description="The training stack: scalebench, torchtitan, command:<name>.")
    precision: str
    layout: str
    num_devices: int
    seed: int = Field(0, description="The run's seed (an axis of the matrix with `seeds`).")
    repeat: int
    status: RunStatus


class RunRead(RunBrief):
    experiment_id: int
    cluster: str
    cancel_requested: bool
    attempts: int
    worker: str | None = Field(description="Worker name and pid; null for anonymous reads.")
    host: str | None = Field(description="Host the run ran on; null for anonymous reads.")
    created_at: datetime
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error_kind: str | None
    error_message: str | None
    slurm_job_id: str | None
    tokens_per_sec_per_device: float | None = Field(None, description="From the run's summary, once recorded.")
    step_ms_median: float | None = Field(None, description="From the run's summary, once recorded.")


class RunError(BaseModel):
    kind: str
    message: str | None


class RunDetail(RunRead):
    spec: dict[str, Any] = Field(description="The RunSpec the runner received (spec.json).")
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    run_dir: str | None = Field(description="Run directory on the worker; null for anonymous reads.")
    imported: bool
    error: RunError | None
    summary: dict[str, Any] | None = Field(description="core.contracts.specs.Summary of a succeeded run.")
    result: dict[str, Any] | None = Field(description="RunResult without steps: environment, numerics, error.")
    steps: list[dict[str, Any]] | None = Field(None, description="Per-step metrics (with ?include_steps=true).")
    links: dict[str, str]


class StatusCounts(BaseModel):
    status: ExperimentStatusName = Field(
        description="Derived from the runs: queued, running, succeeded, failed (all ended, one failed), cancelled."
    )
    counts: dict[str, int] = Field(description="Number of runs per run status.")
    num_runs: int
    progress: float = Field(description="Fraction of runs that ended, 0..1.")


class ExperimentBrief(StatusCounts):
    id: int
    name: str
    cluster: str
    source: str
    tags: list[str]
    created_at: datetime


class ExperimentRead(ExperimentBrief):
    spec: dict[str, Any]
    suite_id: int | None
    links: dict[str, str]


class ExperimentCreated(ExperimentRead):
    runs: list[RunBrief]
    skipped: list[SkippedPointRead] = Field(description="Points of the matrix that cannot exist, with reasons.")
    dispatched: bool = Field(description="False when the broker was down: runs stay queued and are published later.")
    dispatch_message: str | None = None


class ExperimentPage(BaseModel):
    items: list[ExperimentBrief]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")


class RunPage(BaseModel):
    items: list[RunRead]
    next_cursor: str | None


class CancelRead(BaseModel):
    experiment_id: int
    num_cancelled: int = Field(description="Queued runs cancelled now.")
    num_cancel_requested: int = Field(description="Pending and running runs this call marked for their worker to stop.")
    num_stopping: int = Field(
        description="Pending and running runs marked to stop, by this call or an earlier one, that their worker has "
        "not ended yet (a second cancel reports them here, and 0 in num_cancel_requested)."
    )
    status: ExperimentStatusName


class ClusterRead(BaseModel):
    name: str
    vendor: str
    device_name: str
    gpus_per_node: int
    max_nodes: int
    max_devices: int
    launcher: str
    queue: str
    engines: list[str] = Field(
        ["scalebench"],
        description="Engines the cluster offers (ExperimentSpec.engines): "
        "scalebench, torchtitan, command:<name>. A command "
        "engine's command line is the operator's and is not shown.",
    )
    data_roots: list[str] = Field(
        [],
        description="Directories whose regular files a spec's data_path may name, relative to one (none: the "
        "synthetic stream only).",
    )


# ------------------------------------------------------------------------------------------- builders


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"id:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        value = int(raw.removeprefix("id:")) if raw.startswith("id:") else None
    except (binascii.Error, UnicodeDecodeError, ValueError):
        value = None
    if value is None or not 0 < value < 2**31:
        raise ProblemError(
            422,
            "invalid cursor",
            [FieldError(field="query.cursor", message="not a cursor returned by this API (use next_cursor)")],
        )
    return value


def status_fields(st: ExperimentStatus) -> dict[str, Any]:
    return {"status": st.status, "counts": st.counts, "num_runs": st.num_runs, "progress": round(st.progress, 4)}


def experiment_brief(exp: Experiment, st: ExperimentStatus) -> ExperimentBrief:
    return ExperimentBrief(
        id=exp.id,
        name=exp.name,
        cluster=exp.cluster,
        source=exp.source,
        tags=exp.tags,
        created_at=exp.created_at,
        **status_fields(st),
    )


def experiment_read(exp: Experiment, st: ExperimentStatus) -> dict[str, Any]:
    links = {
        "self": f"/experiments/{exp.id}",
        "runs": f"/experiments/{exp.id}/runs",
        "cancel": f"/experiments/{exp.id}/cancel",
        "scaling": f"/experiments/{exp.id}/scaling",
    }
    return dict(
        id=exp.id,
        name=exp.name,
        cluster=exp.cluster,
        source=exp.source,
        tags=exp.tags,
        created_at=exp.created_at,
        spec=exp.spec,
        suite_id=exp.suite_id,
        links=links,
        **status_fields(st),
    )


def skipped_read(points: list[SkippedPoint]) -> list[SkippedPointRead]:
    return [
        SkippedPointRead(
            engine=p.engine, precision=p.precision, layout=p.layout, num_devices=p.num_devices, reason=p.reason
        )
        for p in points
    ]


_RUN_FIELDS = tuple(f for f in RunRead.model_fields if f not in ("tokens_per_sec_per_device", "step_ms_median"))


def run_briefs(run_ids: Sequence[int], runs: Sequence[RunSpec], status: RunStatus) -> list[RunBrief]:
    """The briefs of runs just created (queued by a POST, or succeeded by an import), from their specs."""
    return [
        RunBrief(
            id=i,
            run_key=r.run_key(),
            engine=r.engine,
            precision=r.precision,
            layout=r.layout,
            num_devices=r.num_devices,
            seed=r.seed,
            repeat=r.repeat,
            status=status,
        )
        for i, r in zip(run_ids, runs, strict=True)
    ]


def run_read(run: Run, figures: tuple[float, float] | None = None) -> RunRead:
    """The run's row; `figures` (tokens/s per device, median step ms) from db.experiments.run_figures."""
    values = {f: getattr(run, f) for f in _RUN_FIELDS}
    if figures is not None:
        values["tokens_per_sec_per_device"], values["step_ms_median"] = figures
    return RunRead.model_validate(values)


ANONYMOUS_HIDDEN = ("worker", "host", "run_dir")  # where a run ran: for token holders only


def redact_run(data: dict[str, Any]) -> dict[str, Any]:
    """A run as an anonymous reader sees it: no worker (host:pid), host, run directory or environment hosts, and
    no data checksum of a file outside the data roots."""
    out = data | {k: None for k in ANONYMOUS_HIDDEN if k in data}
    env = (out.get("result") or {}).get("environment")
    if isinstance(env, dict) and env.get("hosts"):
        out["result"] = out["result"] | {"environment": env | {"hosts": []}}
    # The data file's name and checksum only for a file the runner found inside the cluster's data roots (a run
    # recorded before data roots existed may have read any file the worker could: its checksum is not shown).
    spec, numerics = out.get("spec"), (out.get("result") or {}).get("numerics")
    if isinstance(spec, dict) and spec.get("data_path") and not spec.get("data_roots") and isinstance(numerics, dict):
        out["result"] = out["result"] | {"numerics": numerics | {"data": None}}
    return out


def redact_log(text: str, run: Run) -> str:
    """A run's log as an anonymous reader sees it: without what redact_run hides (the run directory and the
    directory of all runs, the worker, the hosts)."""
    secrets: list[tuple[str, str]] = []
    if run.run_dir:
        secrets += [(run.run_dir.rstrip("/"), "<run_dir>"), (os.path.dirname(run.run_dir.rstrip("/")), "<runs>")]
    env = (run.result or {}).get("environment") if isinstance(run.result, dict) else None
    hosts = env.get("hosts") if isinstance(env, dict) else None
    names = [run.worker, run.host, *(hosts if isinstance(hosts, list) else [])]
    secrets += [(str(n), "<host>") for n in names if n]
    # the worker is host:pid: its host part too; longest first, so a name is not half-replaced by a shorter one
    secrets += [(str(n).rsplit(":", 1)[0], "<host>") for n in names if n and ":" in str(n)]
    for secret, shown in sorted({s for s in secrets if len(s[0]) > 1}, key=lambda s: -len(s[0])):
        text = text.replace(secret, shown)
    return text


def summary_dict(summary: RunSummary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {c.key: getattr(summary, c.key) for c in RunSummary.__table__.columns if c.key != "run_id"}


def step_dict(step: StepMetric) -> dict[str, Any]:
    return {
        "step": step.step,
        "loss": step.loss,
        "step_ms": step.step_ms,
        "tokens": step.tokens,
        "grad_norm": step.grad_norm,
        "lr": step.lr,
        "warmup": step.warmup,
    }


def cluster_read(c: Cluster) -> ClusterRead:
    return ClusterRead(
        name=c.name,
        vendor=c.vendor,
        device_name=c.device_name,
        gpus_per_node=c.gpus_per_node,
        max_nodes=c.max_nodes,
        max_devices=c.max_devices,
        launcher=c.launcher,
        queue=c.queue_name,
        engines=engine_names(c),
        data_roots=c.data_roots,
    )
