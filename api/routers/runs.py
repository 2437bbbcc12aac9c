"""Runs: those of an experiment, one run (summary, error, Slurm job id, steps), its steps, its log tail, and
a profiled run's torch.profiler trace."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from sqlalchemy.orm import Session

import db.experiments
import db.runs
from api import etag
from api.deps import ExperimentId, ReadAuth, ReaderAuth, RunId, SessionDep
from api.problems import PROBLEM_RESPONSES, ProblemError, found
from api.schemas.experiments import (
    RunDetail,
    RunPage,
    RunStatus,
    decode_cursor,
    encode_cursor,
    redact_log,
    redact_run,
    run_read,
    step_dict,
    summary_dict,
)
from core.contracts.specs import storable
from db.models import TERMINAL_STATUSES, Experiment, Run

router = APIRouter(tags=["runs"])


@router.get(
    "/experiments/{experiment_id}/runs",
    response_model=RunPage,
    responses=PROBLEM_RESPONSES,
    summary="Runs of an experiment, in id order",
)
def list_runs(
    experiment_id: ExperimentId,
    session: SessionDep,
    auth: ReaderAuth,
    request: Request,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    cursor: Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page.")] = None,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
) -> Any:
    headers, unchanged = etag.check(request, session, [experiment_id])  # polls: 304 from one small query
    if unchanged:
        return unchanged
    response.headers.update(
        headers | {"Vary": "Authorization"}
    )  # token holders see more (api.schemas.experiments.redact_run)
    found(db.experiments.get_experiment(session, experiment_id), "experiment", experiment_id)
    rows = db.experiments.list_runs(session, experiment_id, limit=limit, after_id=decode_cursor(cursor), status=status)
    page, more = rows[:limit], len(rows) > limit
    figures = db.experiments.run_figures(session, [r.id for r in page])
    items = [storable(run_read(r, figures.get(r.id)).model_dump()) for r in page]
    return {
        "items": items if auth.authenticated() else [redact_run(i) for i in items],
        "next_cursor": encode_cursor(page[-1].id) if more else None,
    }


def _run_or_404(session, run_id: int) -> Run:
    return found(db.runs.get_run(session, run_id), "run", run_id)


@router.get(
    "/runs/{run_id}",
    response_model=RunDetail,
    responses=PROBLEM_RESPONSES,
    summary="One run: spec, status, summary, error, Slurm job id, links to steps and log",
)
def get_run(
    run_id: RunId,
    session: SessionDep,
    auth: ReaderAuth,
    response: Response,
    include_steps: Annotated[bool, Query(description="Inline the per-step metrics.")] = False,
) -> Any:
    response.headers["Vary"] = "Authorization"  # token holders see more (api.schemas.experiments.redact_run)
    run = _run_or_404(session, run_id)
    summary = db.runs.get_summary(session, run_id)
    figures = (summary.tokens_per_sec_per_device, summary.step_ms_median) if summary is not None else None
    data = run_read(run, figures).model_dump()  # the figures as the run lists give them
    steps = [step_dict(s) for s in db.runs.get_steps(session, run_id)] if include_steps else None
    detail = data | {
        "spec": run.spec,
        "heartbeat_at": run.heartbeat_at,
        "lease_expires_at": run.lease_expires_at,
        "run_dir": run.run_dir,
        "imported": run.imported,
        "result": run.result,
        "error": {"kind": run.error_kind, "message": run.error_message} if run.error_kind else None,
        "summary": summary_dict(summary),
        "steps": steps,
        "links": {
            "self": f"/runs/{run_id}",
            "steps": f"/runs/{run_id}/steps",
            "log": f"/runs/{run_id}/log",
            "trace": f"/runs/{run_id}/trace",
            "experiment": f"/experiments/{run.experiment_id}",
        },
    }
    detail = storable(detail)  # a value that is somehow bad in the store reads as null, never as a 500
    return detail if auth.authenticated() else redact_run(detail)


def _no_log_why(session: Session, run: Run) -> str:
    """Why a run has no stored log: not started yet, or (ended) never shipped one (imported runs never do)."""
    if run.status not in TERMINAL_STATUSES:
        return f"yet (status {run.status})"
    experiment = session.get(Experiment, run.experiment_id)
    imported = experiment is not None and experiment.source == "import"
    return f"(status {run.status}; {'imported runs keep none' if imported else 'it ended without shipping one'})"


@router.get(
    "/runs/{run_id}/steps",
    response_model=list[dict[str, Any]],
    responses=PROBLEM_RESPONSES,
    summary="Per-step metrics of a run (loss, step_ms, tokens, grad_norm, lr, warmup)",
)
def get_steps(run_id: RunId, session: SessionDep, _auth: ReadAuth) -> Any:
    _run_or_404(session, run_id)
    return [step_dict(s) for s in db.runs.get_steps(session, run_id)]


@router.get(
    "/runs/{run_id}/log",
    response_class=PlainTextResponse,
    responses=PROBLEM_RESPONSES,
    summary="Tail of the run's log (the runner's merged stdout/stderr), from the store",
)
def get_log(
    run_id: RunId,
    session: SessionDep,
    auth: ReaderAuth,
    tail_bytes: Annotated[int, Query(ge=1, le=1 << 20, description="Bytes from the end.")] = 65536,
) -> PlainTextResponse:
    """The worker ships the log's tail (at most 1 MiB, the newest bytes) every few seconds while the run goes
    on, and once more when it ends: headers say how big the whole log was and whether this is the final tail."""
    run = _run_or_404(session, run_id)
    stored = db.runs.get_log(session, run_id)
    if stored is None:
        raise ProblemError(404, f"run {run_id} has no log {_no_log_why(session, run)}")
    tail = stored.text.encode("utf-8")[-tail_bytes:].decode("utf-8", "ignore")
    headers = {"X-Log-Bytes": str(stored.log_bytes), "X-Log-Final": "true" if stored.final else "false"}
    headers["Vary"] = "Authorization"  # token holders see run directories and hosts (redact_log)
    return PlainTextResponse(tail if auth.authenticated() else redact_log(tail, run), headers=headers)


TRACE_CHUNK_BYTES = 1 << 20


def _chunks(data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), TRACE_CHUNK_BYTES):
        yield data[i : i + TRACE_CHUNK_BYTES]


def _gunzipped(data: bytes) -> Iterator[bytes]:
    """The JSON, decompressed a chunk at a time (a GPU trace is ~10x its gzipped size)."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    for chunk in _chunks(data):
        if out := inflate.decompress(chunk):
            yield out
    if tail := inflate.flush():
        yield tail


@router.get(
    "/runs/{run_id}/trace",
    response_class=StreamingResponse,
    responses={
        **PROBLEM_RESPONSES,
        200: {"content": {"application/json": {}}, "description": "chrome-trace JSON (Perfetto, chrome://tracing)"},
    },
    summary="A profiled run's torch.profiler trace of one rank (chrome-trace JSON, streamed)",
)
def get_trace(
    run_id: RunId,
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    rank: Annotated[int, Query(ge=0, le=65535, description="Which rank's trace.")] = 0,
) -> StreamingResponse:
    """Runs with `profile_steps` > 0 record their last steps on every rank; the worker stores each rank's trace
    when the run ends. Sent gzip-encoded to clients that accept it (as stored), else decompressed on the fly."""
    run = _run_or_404(session, run_id)
    stored = db.runs.get_trace(session, run_id, rank)
    if stored is None:
        ranks = db.runs.trace_ranks(session, run_id)
        if ranks:
            raise ProblemError(404, f"run {run_id} has no trace of rank {rank}; stored ranks: {ranks}")
        raise ProblemError(
            404, f"run {run_id} has no trace (status {run.status}): runs record one when profile_steps > 0"
        )
    data = stored.data_gzip
    headers = {
        "Content-Disposition": f'inline; filename="run-{run_id}-rank{rank}.trace.json"',
        "Vary": "Accept-Encoding",
    }
    if "gzip" in request.headers.get("accept-encoding", "").lower():
        headers.update({"Content-Encoding": "gzip", "Content-Length": str(len(data))})
        return StreamingResponse(_chunks(data), media_type="application/json", headers=headers)
    return StreamingResponse(_gunzipped(data), media_type="application/json", headers=headers)
