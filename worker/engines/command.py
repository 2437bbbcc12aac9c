"""Engine `command:<name>`: the operator's own training command, from the cluster's entry in the clusters file.

The worker writes command.json beside spec.json: the cluster's CommandEngine (its argv template, metrics
source, environment), the device it runs on and the number of nodes. `python -m runner.command` then runs once
per node, fills the per-node placeholders (node rank, rendezvous address), starts the command, keeps its log and
reads its metrics back into a RunResult. A request can only name the engine: the command is the operator's.
"""

from __future__ import annotations

from pathlib import Path

from core.clusters import Cluster
from core.engines import COMMAND_FILE
from core.specs import RunSpec, command_name
from worker.engines.base import Program
from worker.launchers.base import write_json_atomic


class CommandEngine:
    name = "command"

    def program(self, spec: RunSpec) -> Program:
        return Program("runner.command", under_torchrun=False)

    def prepare(self, spec: RunSpec, cluster: Cluster, run_dir: Path, num_nodes: int) -> None:
        name = command_name(spec.engine)
        if name is None or name not in cluster.engines:
            offered = ", ".join(sorted(cluster.engines)) or "none"
            raise ValueError(f"engine {spec.engine!r}: cluster {cluster.name!r} defines no such command "
                             f"(its command engines: {offered})")
        write_json_atomic(run_dir / COMMAND_FILE, {
            "engine": spec.engine, "command": cluster.engines[name].model_dump(mode="json"),
            "vendor": cluster.vendor, "device_name": cluster.device_name, "num_nodes": num_nodes})


ENGINE = CommandEngine()
