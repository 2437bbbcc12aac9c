"""Engine `scalebench`: this service's runner, `python -m runner` under torchrun."""

from __future__ import annotations

import os
from pathlib import Path

from core.clusters import Cluster
from core.specs import RunSpec
from worker.engines.base import Program


class ScalebenchEngine:
    name = "scalebench"

    def program(self, spec: RunSpec) -> Program:
        # SCALEBENCH_RUNNER_MODULE: another training program with the runner's CLI (default: ours).
        return Program(os.environ.get("SCALEBENCH_RUNNER_MODULE", "runner"))

    def prepare(self, spec: RunSpec, cluster: Cluster, run_dir: Path, num_nodes: int) -> None:
        return None


ENGINE = ScalebenchEngine()
