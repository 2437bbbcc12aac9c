"""The engine contract: a Program to start, and the files it needs beside spec.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from core.clusters import Cluster
from core.specs import RunSpec


@dataclass(frozen=True)
class Program:
    """`python -m <module> --spec spec.json --out result.json`, under torchrun (one process per rank) or,
    when under_torchrun is False, once per node (the program starts its own ranks)."""

    module: str
    under_torchrun: bool = True


class Engine(Protocol):
    name: str

    def program(self, spec: RunSpec) -> Program: ...

    def prepare(self, spec: RunSpec, cluster: Cluster, run_dir: Path, num_nodes: int) -> None:
        """Write what the program needs beside spec.json (nothing for the built-in engines)."""
        ...
