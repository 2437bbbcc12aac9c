"""The launcher contract shared by the local torchrun launcher and the Slurm launcher.

A run directory holds: spec.json (the RunSpec), result.json (written by the engine's program: the runner's
rank 0), log.txt (the program's merged stdout/stderr), handle.json (what is needed to re-attach: pid/pgid or
Slurm job id), command.json for a command engine (core.engines.command) and, for a profiled run,
trace.rank{R}.json.gz (each rank's profiler trace, core.analysis.breakdown.TRACE_FILE).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from core.analysis.breakdown import TRACE_FILE
from core.contracts.clusters import Cluster
from core.contracts.specs import ErrorKind, RunResult, RunSpec
from core.engines.command import COMMAND_FILE
from core.engines.registry import command_file

SPEC_FILE, RESULT_FILE, LOG_FILE, HANDLE_FILE = "spec.json", "result.json", "log.txt", "handle.json"
_TRACE_RE = re.compile("^" + re.escape(TRACE_FILE).replace(re.escape("{rank}"), r"(\d+)") + "$")


@dataclass
class LaunchHandle:
    """Identifies a started run so that a worker (or a restarted one) can poll, cancel or re-attach."""

    run_id: str
    run_dir: str
    launcher: str  # "local" | "slurm"
    pid: int | None = None  # local: the torchrun process, leader of its own process group
    job_id: str | None = None  # slurm
    started_at: float = 0.0  # unix seconds
    deadline: float | None = None  # unix seconds: wall-clock limit of the run
    extra: dict = field(default_factory=dict)

    def save(self) -> None:
        write_json_atomic(Path(self.run_dir) / HANDLE_FILE, asdict(self))

    @classmethod
    def load(cls, run_dir: str | Path) -> LaunchHandle | None:
        p = Path(run_dir) / HANDLE_FILE
        if not p.exists():
            return None
        return cls(**json.loads(p.read_text()))


@dataclass
class LaunchOutcome:
    """How a launched run ended. `result` is the runner's RunResult when result.json could be read."""

    state: str  # "succeeded" | "failed" | "pending" | "running" | "cancelled"
    result: RunResult | None = None
    error_kind: ErrorKind | None = None
    message: str | None = None
    exit_code: int | None = None
    log_tail: str = ""
    retryable: bool = False  # an infrastructure failure (node failure, preemption) worth one more attempt


class Launcher(Protocol):
    name: str

    def start(self, spec: RunSpec, run_id: str, run_dir: Path) -> LaunchHandle: ...

    def poll(self, handle: LaunchHandle) -> LaunchOutcome: ...  # state "pending"/"running" while not done

    def cancel(self, handle: LaunchHandle) -> None: ...


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def prepare_run_dir(spec: RunSpec, run_id: str, run_dir: Path, cluster: Cluster, num_nodes: int = 1) -> Path:
    """spec.json, and command.json beside it for a command engine (core.engines.registry.command_file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / SPEC_FILE, spec.model_dump(mode="json"))
    if (launch := command_file(spec, cluster, num_nodes)) is not None:
        write_json_atomic(run_dir / COMMAND_FILE, launch)
    return run_dir


def read_log_tail(run_dir: str | Path, max_bytes: int) -> tuple[bytes, int]:
    """The last `max_bytes` of the run's log.txt and the log's whole size (b"", 0 when there is none)."""
    p = Path(run_dir) / LOG_FILE
    try:
        with p.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read(), size
    except FileNotFoundError:
        return b"", 0


def log_tail(run_dir: str | Path, max_bytes: int = 4000) -> str:
    return read_log_tail(run_dir, max_bytes)[0].decode("utf-8", "replace")


def read_result(run_dir: str | Path) -> tuple[RunResult | None, str | None]:
    """The runner's result.json, or None and why it could not be read."""
    p = Path(run_dir) / RESULT_FILE
    if not p.exists():
        return None, "result.json was not written"
    try:
        return RunResult.model_validate_json(p.read_text()), None
    except (ValidationError, ValueError) as exc:
        return None, f"result.json is invalid: {exc}"


def trace_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(rank, path) of the profiler traces in a run directory, by rank (none when the run was not profiled)."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).iterdir() if (m := _TRACE_RE.match(p.name))]
    return sorted(found)
