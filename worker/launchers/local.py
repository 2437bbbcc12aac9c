"""Local launcher: the run's engine program on this node, as its own process group, logging to the run dir.

    python -m torch.distributed.run --standalone --nproc-per-node N -m runner --spec DIR/spec.json --out DIR/result.json

The module is the engine's (core.engines.registry: runner, runner.titan); a program that starts its own ranks (a
command engine: runner.command) runs without torchrun, as `python -m runner.command --spec ... --out ...`.

Argument lists only (never a shell string). The worker does not import torch: torchrun is a program.
Children die with the worker: torchrun gets PR_SET_PDEATHSIG=SIGTERM and forwards SIGTERM to its ranks;
cancel/timeout additionally sweep every process whose command line names this run's spec.json (ranks run in
their own sessions, see worker/procs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.contracts.clusters import LOCAL_CPU, Cluster
from core.contracts.specs import RunSpec
from core.engines.registry import program_for
from osutil import procs
from worker.launchers.base import (
    LOG_FILE,
    RESULT_FILE,
    SPEC_FILE,
    LaunchHandle,
    LaunchOutcome,
    log_tail,
    prepare_run_dir,
    read_result,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
# Popen objects of runs started by this process, by pid, so that exits are reaped (no zombies) with their code.
_CHILDREN: dict[int, subprocess.Popen] = {}


class LocalLauncher:
    name = "local"

    def __init__(
        self,
        cluster: Cluster = LOCAL_CPU,
        kill_grace_s: float = 5.0,
        python: str = sys.executable,
        cpu_count: int | None = None,
    ):
        self.cluster = cluster
        self.kill_grace_s = kill_grace_s
        self.python = python
        self.cpu_count = cpu_count or os.cpu_count() or 1

    # ------------------------------------------------------------------------------------------ start

    def command(self, spec: RunSpec, run_dir: Path) -> list[str]:
        program = program_for(spec)
        launch = (
            [self.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(spec.num_devices)]
            if program.under_torchrun
            else [self.python]
        )
        return [*launch, "-m", program.module, "--spec", str(run_dir / SPEC_FILE), "--out", str(run_dir / RESULT_FILE)]

    def environment(self, spec: RunSpec) -> dict[str, str]:
        env = dict(os.environ)  # NCCL_*/RCCL_*/CUDA_VISIBLE_DEVICES/... pass through unchanged
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach log.txt as they are printed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        if spec.device_type == "cpu":
            # N gloo ranks share the node's cores; oversubscribed OpenMP threads would distort throughput.
            env["OMP_NUM_THREADS"] = str(max(1, self.cpu_count // spec.num_devices))
            # Spinning OpenMP threads of one rank steal the cores of the others (and of anything else on a
            # shared node): measured here, 1 rank x 2 threads on a busy 2-core box took 3080 ms/step with the
            # default policy and 60 ms with PASSIVE.
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return env

    def start(self, spec: RunSpec, run_id: str, run_dir: Path) -> LaunchHandle:
        run_dir = prepare_run_dir(spec, run_id, Path(run_dir).resolve(), self.cluster)
        (run_dir / RESULT_FILE).unlink(missing_ok=True)  # a previous attempt's result must not be read as ours
        cmd = self.command(spec, run_dir)
        with (run_dir / LOG_FILE).open("ab") as log_file:
            log_file.write(f"[scalebench] {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            log_file.flush()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(spec),
                cwd=str(run_dir),
                start_new_session=True,
                preexec_fn=procs.set_parent_death_signal,
                close_fds=True,
            )
        _CHILDREN[proc.pid] = proc
        now = time.time()
        handle = LaunchHandle(
            run_id=run_id,
            run_dir=str(run_dir),
            launcher=self.name,
            pid=proc.pid,
            started_at=now,
            deadline=now + spec.timeout_s,
            extra={
                "pgid": proc.pid,
                "host": socket.gethostname(),
                "start_ticks": procs.start_time_ticks(proc.pid),
                "spec_arg": str(run_dir / SPEC_FILE),
                "timeout_s": spec.timeout_s,
            },
        )
        handle.save()
        log.info("run %s: started torchrun pid %d with %d ranks in %s", run_id, proc.pid, spec.num_devices, run_dir)
        return handle

    # ------------------------------------------------------------------------------------------- poll

    def poll(self, handle: LaunchHandle) -> LaunchOutcome:
        running, exit_code = _status(handle)
        if running:
            if handle.deadline is not None and time.time() > handle.deadline:
                return self._timeout(handle)
            return _early_success(handle) or LaunchOutcome(state="running")
        _CHILDREN.pop(handle.pid or -1, None)
        # torchrun is gone, but ranks live in their own sessions: make sure none is left behind.
        self._sweep(handle)
        return outcome_from_run_dir(handle.run_dir, exit_code)

    def _timeout(self, handle: LaunchHandle) -> LaunchOutcome:
        limit_s = handle.extra.get("timeout_s")
        log.warning("run %s: past its wall-clock limit (%s s): ending its process group", handle.run_id, limit_s)
        self._terminate(handle)
        tail = log_tail(handle.run_dir)
        return LaunchOutcome(
            state="failed",
            error_kind="timeout",
            exit_code=None,
            log_tail=tail,
            message=f"the run exceeded its wall-clock limit of {limit_s} s (timeout_s) and was ended",
        )

    def finish(self, handle: LaunchHandle, grace_s: float = 30.0, stop_waiting=None) -> None:
        """After a result was taken early: wait for torchrun's teardown (the node is not free before), then
        end whatever is left. stop_waiting (a callable, e.g. "the worker is stopping") cuts the wait short."""
        deadline = time.monotonic() + grace_s
        while _status(handle)[0] and time.monotonic() < deadline and not (stop_waiting and stop_waiting()):
            time.sleep(0.1)
        if _status(handle)[0]:
            log.warning(
                "run %s: torchrun still alive %.0f s after its result: ending it",
                handle.run_id,
                grace_s - max(0.0, deadline - time.monotonic()),
            )
            self._terminate(handle, grace_s=1.0 if stop_waiting and stop_waiting() else None)
        _CHILDREN.pop(handle.pid or -1, None)
        self._sweep(handle)

    # ----------------------------------------------------------------------------------------- cancel

    def cancel(self, handle: LaunchHandle, grace_s: float | None = None) -> None:
        """End the run's processes: SIGTERM, SIGKILL after grace_s (default kill_grace_s)."""
        grace_s = self.kill_grace_s if grace_s is None else grace_s
        log.info("run %s: cancelling (SIGTERM, SIGKILL after %.1f s)", handle.run_id, grace_s)
        self._terminate(handle, grace_s)

    def _terminate(self, handle: LaunchHandle, grace_s: float | None = None) -> None:
        pgid = handle.extra.get("pgid", handle.pid)
        if pgid is not None and not procs.is_alive(pgid, handle.extra.get("start_ticks")):
            pgid = None  # exited already (or the pid was reused): signal nothing by pid
        proc = _CHILDREN.get(handle.pid or -1)
        procs.terminate_run_processes(
            pgid,
            handle.extra.get("spec_arg", str(Path(handle.run_dir) / SPEC_FILE)),
            grace_s=self.kill_grace_s if grace_s is None else grace_s,
            reap=proc.poll if proc else None,
        )
        _CHILDREN.pop(handle.pid or -1, None)

    def _sweep(self, handle: LaunchHandle) -> None:
        spec_arg = handle.extra.get("spec_arg", str(Path(handle.run_dir) / SPEC_FILE))
        if procs.pids_with_arg(spec_arg):
            log.warning("run %s: torchrun exited but ranks remain: ending them", handle.run_id)
            procs.terminate_run_processes(None, spec_arg, grace_s=self.kill_grace_s)


def _status(handle: LaunchHandle) -> tuple[bool, int | None]:
    """(still running, exit code when known). Exit codes are known only for children of this process."""
    proc = _CHILDREN.get(handle.pid or -1)
    if proc is not None:
        code = proc.poll()
        return code is None, code
    alive = handle.pid is not None and procs.is_alive(handle.pid, handle.extra.get("start_ticks"))
    return alive, None


def _early_success(handle: LaunchHandle) -> LaunchOutcome | None:
    """A succeeded result.json while torchrun still tears its ranks down (~1-2 s): the result can be recorded
    now (the caller then calls finish()). A failed result waits for the exit: rank 0 may still replace a
    peer's 'connection closed' with the root cause."""
    path = Path(handle.run_dir) / RESULT_FILE
    if not path.exists():
        return None
    result, _why = read_result(handle.run_dir)
    if result is None or result.status != "succeeded":
        return None
    return LaunchOutcome(state="succeeded", result=result, log_tail=log_tail(handle.run_dir))


def outcome_from_run_dir(run_dir: str | Path, exit_code: int | None) -> LaunchOutcome:
    """How a finished run ended, from result.json, else the exit code and the log tail."""
    result, why = read_result(run_dir)
    tail = log_tail(run_dir)
    if result is not None:
        if result.status == "succeeded":
            return LaunchOutcome(state="succeeded", result=result, exit_code=exit_code, log_tail=tail)
        assert result.error is not None
        return LaunchOutcome(
            state="failed",
            result=result,
            error_kind=result.error.kind,
            message=result.error.message,
            exit_code=exit_code,
            log_tail=tail,
        )
    if exit_code is not None and exit_code < 0:
        # Killed by a signal that we did not send (we return 'timeout'/'cancelled' for ours): the node's OOM
        # killer, an operator, a preemption. Worth a bounded retry.
        name = signal.Signals(-exit_code).name
        return LaunchOutcome(
            state="failed",
            error_kind="infrastructure",
            exit_code=exit_code,
            log_tail=tail,
            retryable=True,
            message=f"torchrun was killed by {name} and wrote no result ({why})",
        )
    if exit_code == 0:
        return LaunchOutcome(
            state="failed",
            error_kind="result_missing",
            exit_code=0,
            log_tail=tail,
            message=f"torchrun exited 0 but {why}",
        )
    code = "unknown" if exit_code is None else str(exit_code)
    return LaunchOutcome(
        state="failed",
        error_kind="error",
        exit_code=exit_code,
        log_tail=tail,
        message=f"torchrun exited with code {code} and {why}",
    )
