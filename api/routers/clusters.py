"""Clusters: where runs execute (from the clusters file; local-cpu always exists)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ClustersDep, ReadAuth
from api.problems import PROBLEM_RESPONSES
from api.schemas.experiments import ClusterRead, cluster_read

router = APIRouter(prefix="/clusters", tags=["clusters"])


@router.get("", response_model=list[ClusterRead], responses=PROBLEM_RESPONSES, summary="Configured clusters")
def list_clusters(clusters: ClustersDep, _auth: ReadAuth) -> list[ClusterRead]:
    return [cluster_read(c) for c in sorted(clusters.values(), key=lambda c: c.name)]
