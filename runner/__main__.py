"""`python -m runner --spec spec.json --out result.json` (under torchrun, or as one process).

Rank 0 writes result.json atomically (temp file + rename). A failing rank other than 0 writes it only when
it does not exist yet (rank 0 may be killed by torchrun before it can write; rank 0 overwrites when it can).
Exit code 0 only on success. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from core.contracts.specs import RunError, RunResult, RunSpec

log = logging.getLogger("runner")


def setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=os.environ.get("SCALEBENCH_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"%(asctime)s [rank{rank}] %(name)s %(levelname)s %(message)s",
    )


def write_result(path: Path, result: RunResult, *, only_if_absent: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(result.model_dump_json(indent=1))
    if only_if_absent:
        try:
            os.link(tmp, path)  # atomic create-if-absent
        except FileExistsError:
            pass
        tmp.unlink()
    else:
        os.replace(tmp, path)


def rank_file(out: Path, rank: int) -> Path:
    return out.with_name(f".{out.name}.rank{rank}.error.json")


PEER_FAILURE_HINTS = ("closed by peer", "remote worker", "connection reset", "broken pipe")


def prefer_root_cause(result: RunResult, out: Path, wait_s: float = 3.0) -> RunResult:
    """When rank 0 failed only because a peer did (timeout, closed connection), report the peer's error."""
    own = result.error
    assert own is not None
    if own.kind != "comm_timeout" and not any(h in own.message.lower() for h in PEER_FAILURE_HINTS):
        return result
    deadline = time.monotonic() + wait_s
    while True:
        for path in sorted(out.parent.glob(f".{out.name}.rank*.error.json")):
            try:
                peer = RunError.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue
            if peer.kind != "comm_timeout":
                rank = path.name.rsplit(".rank", 1)[1].split(".")[0]
                message = f"rank {rank}: {peer.message}\n(rank 0 saw: {own.message[:2000]})"
                error = peer.model_copy(update={"message": message[:20000]})
                return result.model_copy(update={"error": error})
        if time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def load_spec(path: Path) -> tuple[RunSpec | None, RunResult | None]:
    """The RunSpec, or an invalid_config result when the file is missing or does not validate."""
    try:
        return RunSpec.model_validate_json(path.read_text()), None
    except (OSError, ValidationError, ValueError) as exc:
        raw = path.read_bytes() if path.exists() else b""
        key = "invalid-spec-" + hashlib.sha256(raw).hexdigest()[:16]
        err = RunError(kind="invalid_config", message=f"spec {path}: {exc}"[:20000])
        return None, RunResult(run_key=key, status="failed", error=err)


def train_with_runner(spec: RunSpec, run_dir: Path) -> RunResult:
    from runner.train import run  # torch import after argument parsing: fast --help

    return run(spec, trace_dir=run_dir)  # profiler traces beside result.json


def main(
    argv: list[str] | None = None,
    *,
    prog: str = "python -m runner",
    train: Callable[[RunSpec, Path], RunResult] = train_with_runner,
) -> NoReturn:
    """The program of an engine that trains in this process: `train(spec, run_dir)` returns every rank's
    RunResult (our runner's by default; runner.titan passes TorchTitan's); writing it and the exit code are
    the same for every such engine."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="RunSpec JSON file")
    parser.add_argument("--out", required=True, type=Path, help="RunResult JSON file (written by rank 0)")
    args = parser.parse_args(argv)
    setup_logging()
    rank = int(os.environ.get("RANK", "0"))
    spec, result = load_spec(args.spec)
    if spec is not None:
        log.info(
            "run %s: %s %s %s layers=%d %s %s",
            spec.run_key(),
            spec.engine,
            spec.model,
            spec.precision,
            spec.num_layers,
            spec.layout,
            json.dumps(spec.degrees.model_dump()),
        )
        result = train(spec, args.out.parent)
    assert result is not None
    if rank == 0:
        if result.status == "failed":
            result = prefer_root_cause(result, args.out)
        write_result(args.out, result)
    elif result.status == "failed" and result.error is not None:  # a failed result carries its error
        # A note for rank 0 (its own error may only say that a peer went away), then the result itself
        # if rank 0 has not written one: torchrun may kill rank 0 before it can.
        rank_file(args.out, rank).write_text(result.error.model_dump_json())
        # Named like rank 0's root-cause report, so the message says which rank failed either way.
        named = result.error.model_copy(update={"message": f"rank {rank}: {result.error.message}"[:20000]})
        write_result(args.out, result.model_copy(update={"error": named}), only_if_absent=True)
    if result.status == "failed" and result.error is not None:
        log.error("failed: %s: %s", result.error.kind, result.error.message.splitlines()[0])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a failure a broken process group can hang it (threads blocked in
    # collectives); after a success it only costs time (torch's module and thread teardown: ~1-3 s of a CPU
    # rank). The result is written and the group destroyed by now.
    os._exit(1 if result.status == "failed" else 0)


if __name__ == "__main__":
    sys.exit(main())
