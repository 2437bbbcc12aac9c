"""Engines, the worker's side: what program a run's launcher starts, and what it leaves in the run directory.

One module per engine (scalebench, torchtitan, command), each with `program(spec)` and `prepare(...)`. The
launchers (local torchrun, Slurm) ask `engine_for(spec)` and start its Program: under torchrun (N ranks), or
once per node for a program that starts its own ranks (a command engine). They never branch on the engine.
Every program writes result.json (a core.specs.RunResult) in the run directory.
"""

from __future__ import annotations

from core.specs import RunSpec, command_name
from worker.engines import command, scalebench, torchtitan
from worker.engines.base import Engine, Program

__all__ = ["Engine", "Program", "engine_for"]


def engine_for(spec: RunSpec) -> Engine:
    if spec.engine == "scalebench":
        return scalebench.ENGINE
    if spec.engine == "torchtitan":
        return torchtitan.ENGINE
    assert command_name(spec.engine) is not None, spec.engine  # RunSpec validated the name
    return command.ENGINE
