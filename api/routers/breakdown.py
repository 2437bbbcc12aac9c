"""Where the step time goes along N: the breakdown of an experiment's profiled runs (JSON or CSV).

Runs with `profile_steps` > 0 carry a step breakdown (core.analysis.breakdown): GEMMs by precision, fp8 casts,
attention, other elementwise, optimizer, communication (exposed and overlapped) and idle, in ms per step.
Per series (precision x layout) and N: the median over the runs. The ETag is the experiment's fingerprint,
so a poll of an unchanged experiment is a 304 from one small query.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response

import db.experiments
import db.runs
from api import etag
from api.deps import ExperimentId, ReadAuth, SessionDep
from api.problems import PROBLEM_RESPONSES, found
from core.analysis.breakdown import Breakdown, ExperimentBreakdown, breakdown_csv, experiment_breakdown

router = APIRouter(tags=["analysis"])


@router.get(
    "/experiments/{experiment_id}/breakdown",
    response_model=ExperimentBreakdown,
    responses={
        **PROBLEM_RESPONSES,
        304: {"description": "Not Modified: If-None-Match holds the ETag."},
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with ?format=csv"},
    },
    summary="Step time by category at each N, per series, and the exposed-communication share",
)
def get_breakdown(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    _auth: ReadAuth,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv (one row per point).")] = "json",
) -> Any:
    headers, unchanged = etag.check(request, session, [experiment_id])
    if unchanged:
        return unchanged
    found(db.experiments.get_experiment(session, experiment_id), "experiment", experiment_id)
    rows = [
        (r.run_id, r.precision, r.layout, r.num_devices, Breakdown.model_validate(r.breakdown))
        for r in db.runs.breakdown_rows(session, experiment_id)
    ]
    report = experiment_breakdown(experiment_id, rows)
    if format == "csv":
        headers["Content-Disposition"] = f'inline; filename="experiment-{experiment_id}-breakdown.csv"'
        return Response(breakdown_csv(report), media_type="text/csv; charset=utf-8", headers=headers)
    return Response(report.model_dump_json(), media_type="application/json", headers=headers)
