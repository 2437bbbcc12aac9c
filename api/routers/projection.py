"""Projected scaling (X, E, S at device counts not measured) and a training plan for a token budget.

Both read the experiment's measured points (db.points), step breakdowns where the runs carry one, and the
network of a cluster (its [cluster.network] table; without one, the platform its device implies), then
model each series with core.projection.model. Every answer lists the network and assumptions it used.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session

import db.breakdowns
import db.points
from api import etag
from api.deps import NOT_MODIFIED, ClustersDep, ExperimentId, ReadAuth, SessionDep
from api.problems import PROBLEM_RESPONSES, found
from api.schemas.projection import (
    PlanRead,
    ProjectionRead,
    bad_query,
    parse_gpu_counts,
    parse_layouts,
    parse_stack_query,
    parse_tokens,
    projection_csv,
)
from core.analysis.scaling import build_report
from core.contracts.clusters import Cluster
from core.contracts.stacks import STACK_FIELDS, STACK_FORM
from core.projection.model import NetworkUsed, project_report
from core.projection.network import default_network
from core.projection.plan import DEFAULT_MIN_EFFICIENCY, build_plan, default_plan_layouts, plan_counts
from db.models import Experiment

router = APIRouter(tags=["analysis"])
ClusterName = Annotated[
    str | None,
    Query(
        max_length=100,
        description=(
            "Configured cluster whose network to project onto (GET /clusters); default: the experiment's own."
        ),
    ),
]
StackQuery = Annotated[
    str | None,
    Query(
        max_length=400,
        description=(
            "The measured stack's data-parallel traffic and schedule, where it is not the scalebench runner's "
            "(an imported series, a command engine): "
            + STACK_FORM
            + ". Fields not given keep the runner's. "
            + "; ".join(f"{k}: {what}" for k, (_, what) in STACK_FIELDS.items())
        ),
    ),
]
NODE_SIZE_ASSUMED = 8  # GPUs per node of every platform in core.projection.network.PLATFORMS


def _usable(clusters: dict[str, Cluster]) -> list[str]:
    return sorted(n for n, c in clusters.items() if c.network or default_network(c.device_name)[0])


def _none_usable(clusters: dict[str, Cluster]) -> str:
    """What to do when no configured cluster can be projected onto ('' when one can)."""
    if _usable(clusters):
        return ""
    return (
        " (no configured cluster has a network: describe one in the clusters file SCALEBENCH_CLUSTERS_FILE names, "
        "e.g. examples/clusters.toml, with a [cluster.network] table or a known device)"
    )


def _network(session: Session, clusters: dict[str, Cluster], exp: Experiment, name: str | None) -> NetworkUsed:
    """The asked-for (or the experiment's) cluster's network; a 422 naming `cluster` when there is none."""
    if name is not None and name not in clusters:
        raise bad_query("cluster", f"unknown cluster {name!r}{_none_usable(clusters)}", _usable(clusters))
    target = name or exp.cluster
    cluster = clusters.get(target)
    if cluster is not None and cluster.network is not None:
        net = cluster.network
        return NetworkUsed(
            cluster=target,
            source=f"cluster {target!r} [cluster.network]",
            gpus_per_node=cluster.gpus_per_node,
            max_devices=cluster.max_devices,
            inter_node_gb_per_s=net.inter_node_gb_per_s,
            network=net,
        )
    device = cluster.device_name if cluster else db.breakdowns.device_name(session, exp.id)
    inferred, why = default_network(device or "")
    if inferred is None:
        raise bad_query(
            "cluster",
            f"cluster {target!r} describes no network and {why}; name a cluster that has one or whose device is "
            f"known{_none_usable(clusters)}",
            _usable(clusters),
        )
    # one machine of one GPU says nothing of the nodes a larger cluster of it would have: the assumed platform's
    source = f"assumed: {why}; cluster {target!r} describes no network"
    node = cluster.gpus_per_node if cluster else NODE_SIZE_ASSUMED
    if cluster and cluster.max_devices == 1:
        node = NODE_SIZE_ASSUMED
        source += f"; {node} GPUs a node as on that platform, the cluster being one GPU"
    return NetworkUsed(
        cluster=target,
        source=source,
        gpus_per_node=node,
        max_devices=cluster.max_devices if cluster else None,
        inter_node_gb_per_s=inferred.inter_node_gb_per_s,
        network=inferred,
    )


def _load(session: Session, clusters: dict[str, Cluster], experiment_id: int, cluster: str | None):
    exp = found(session.get(Experiment, experiment_id), "experiment", experiment_id)
    net = _network(session, clusters, exp, cluster)
    spec = dict(exp.spec)
    points = db.points.load_run_points(session, experiment_id)
    breakdowns = db.breakdowns.load_breakdowns(session, experiment_id)
    session.close()  # hand the connection back before the CPU-bound model
    return exp, spec, net, build_report(points), breakdowns


@router.get(
    "/experiments/{experiment_id}/projection",
    response_model=ProjectionRead,
    responses={
        **PROBLEM_RESPONSES,
        **NOT_MODIFIED,
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with ?format=csv"},
    },
    summary="Projected X(N), E(N), S(N) per series on a cluster's network, measured points beside them",
)
def get_projection(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    clusters: ClustersDep,
    _auth: ReadAuth,
    cluster: ClusterName = None,
    gpu_counts: Annotated[
        str | None,
        Query(
            max_length=400,
            description=(
                "Comma-separated device counts to project, e.g. 8,64,512,1024; the measured counts are always added. "
                "Default: 8 to 1024 in powers of two."
            ),
        ),
    ] = None,
    calibrate: Annotated[
        bool | None,
        Query(
            description=(
                "Fit the inter-node efficiency and device speed spread to the measured points beyond N0 first. "
                "Unset (default): for each series with a measured point beyond N0 across nodes (where a check on "
                "published series found it projects the larger N better); true: for every series measured beyond "
                "N0; false: never, each series from its N0 alone."
            )
        ),
    ] = None,
    layouts: Annotated[
        str | None,
        Query(
            max_length=400,
            description=(
                "Comma-separated layout templates to project each measured series onto as well, e.g. "
                "pp=4+tp=2+fsdp,cp=2+fsdp (pipeline and context parallel included; encode + as %2B): the "
                "measured per-token compute of N0 laid out anew."
            ),
        ),
    ] = None,
    stack: StackQuery = None,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv (one row per point).")] = "json",
) -> Any:
    counts = parse_gpu_counts(gpu_counts)
    extra_layouts = parse_layouts(layouts)
    described = parse_stack_query(stack)
    headers, unchanged = etag.check(request, session, [experiment_id])
    if unchanged:
        return unchanged
    _, spec, net, report, breakdowns = _load(session, clusters, experiment_id, cluster)
    projected = project_report(
        report, spec, net, counts, breakdowns=breakdowns, calibrate=calibrate, layouts=extra_layouts, stack=described
    )
    body = ProjectionRead(experiment_id=experiment_id, **dict(projected))
    if format == "csv":
        headers["Content-Disposition"] = f'inline; filename="experiment-{experiment_id}-projection.csv"'
        return Response(projection_csv(body), media_type="text/csv; charset=utf-8", headers=headers)
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


@router.get(
    "/experiments/{experiment_id}/plan",
    response_model=PlanRead,
    responses={**PROBLEM_RESPONSES, **NOT_MODIFIED},
    summary="Time and GPU-hours to train a token budget per precision x layout x N; fastest and cheapest",
)
def get_plan(
    experiment_id: ExperimentId,
    request: Request,
    session: SessionDep,
    clusters: ClustersDep,
    _auth: ReadAuth,
    tokens: Annotated[str, Query(max_length=40, description="Token budget: 1e12, 1T, 500B, ...")],
    max_gpus: Annotated[int, Query(ge=1, le=1 << 20, description="GPU cap of the plan.")],
    cluster: ClusterName = None,
    gpu_hour_cost: Annotated[float | None, Query(ge=0, le=1e6, description="Price of one GPU-hour.")] = None,
    min_efficiency: Annotated[
        float, Query(gt=0, le=1, description=("Efficiency E(N) the cheapest plan must keep (a fraction)."))
    ] = DEFAULT_MIN_EFFICIENCY,
    calibrate: Annotated[
        bool | None, Query(description="Calibrate the projection first (see /projection; unset: as there).")
    ] = None,
    layouts: Annotated[
        str | None,
        Query(
            max_length=400,
            description=(
                "Comma-separated layout templates to plan with besides the measured ones (each measured series "
                "projected onto them), e.g. "
                "pp=4+tp=2+fsdp,cp=2+fsdp (pipeline and context parallel included; encode + as %2B): the "
                "measured per-token compute of N0 laid out anew. Omitted: pp=2, pp=4, pp=8 and cp=2 over each "
                "measured layout (pp=2+fsdp, ..., cp=2+fsdp), so that the best layout per N weighs pipeline and "
                "context parallelism too; empty (layouts=): the measured layouts only."
            ),
        ),
    ] = None,
    stack: StackQuery = None,
) -> Any:
    budget = parse_tokens(tokens)
    asked = parse_layouts(layouts) if layouts is not None else None
    described = parse_stack_query(stack)
    headers, unchanged = etag.check(request, session, [experiment_id])
    if unchanged:
        return unchanged
    _, spec, net, report, breakdowns = _load(session, clusters, experiment_id, cluster)
    counts = plan_counts((p.num_devices for s in report.series for p in s.points if p.tokens_per_sec), max_gpus)
    extra_layouts = asked if asked is not None else default_plan_layouts(s.key.layout for s in report.series)
    projected = project_report(
        report, spec, net, counts, breakdowns=breakdowns, calibrate=calibrate, layouts=extra_layouts, stack=described
    )
    plan = build_plan(
        report, projected, tokens=budget, max_gpus=max_gpus, min_efficiency=min_efficiency, gpu_hour_cost=gpu_hour_cost
    )
    body = PlanRead(
        experiment_id=experiment_id,
        network=net,
        assumptions=projected.assumptions,
        stacks=projected.stacks,
        **dict(plan),
    )
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)
