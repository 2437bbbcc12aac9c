"""Engine `torchtitan`: upstream TorchTitan's own Trainer, `python -m runner.titan` under torchrun.

runner.titan builds TorchTitan's job config from the RunSpec (core.titan_config) and times the optimizer steps
the way our runner does; the nodes need the `torchtitan` extra (core.engines refuses the engine on a cluster
that does not say it has it)."""

from __future__ import annotations

from pathlib import Path

from core.clusters import Cluster
from core.specs import RunSpec
from worker.engines.base import Program


class TorchTitanEngine:
    name = "torchtitan"

    def program(self, spec: RunSpec) -> Program:
        return Program("runner.titan")

    def prepare(self, spec: RunSpec, cluster: Cluster, run_dir: Path, num_nodes: int) -> None:
        return None


ENGINE = TorchTitanEngine()
