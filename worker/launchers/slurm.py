"""Slurm launcher: one sbatch job per run; `srun` starts one torchrun agent per task, c10d rendezvous on the
first node (rendezvous id = run id), the runner reading spec.json and writing result.json in the run directory,
which must be on a path every node sees (SlurmOptions.shared_dir).

Every sbatch option is an argument of `sbatch` (argument list, never a shell string); the job script holds only
literals passed through shlex.quote. The worker holds no node: start() returns once sbatch has queued the job,
poll() asks `scontrol show job` (and `sacct` once the job has left the controller) and maps Slurm's state.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.contracts.clusters import Cluster, SlurmOptions
from core.contracts.slurm_layout import JobLayout as JobLayout  # re-exported: the one split rule, shared with
from core.contracts.slurm_layout import job_layout  # the matrix (core.contracts.matrix skips what it refuses)
from core.contracts.specs import RunSpec
from core.engines.registry import program_for
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
from worker.launchers.local import outcome_from_run_dir

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FILE = "job.sbatch"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Worker environment passed into the job script by name (captured at submission): collective-library and
# allocator tuning. *_VISIBLE_DEVICES are left to Slurm's GPU binding.
ENV_PREFIXES = (
    "NCCL_",
    "RCCL_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
    "GLOO_",
    "HSA_",
    "MIOPEN_",
    "UCX_",
    "FI_",
    "TORCHINDUCTOR_",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "CUDA_DEVICE_MAX_CONNECTIONS",
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The worker's own secrets stay out of the job (sbatch --export=ALL copies sbatch's environment into it).
SECRET_ENV_RE = re.compile(r"^(SCALEBENCH_.*|DATABASE_URL|REDIS_URL|.*(PASSWORD|SECRET|TOKEN).*)$", re.IGNORECASE)

PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
# Terminal states that are not the run's own fault: the service retries them (bounded).
INFRA_STATES = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "REVOKED"}


class SlurmError(RuntimeError):
    """sbatch refused the job, or Slurm's commands could not be run (the worker records a launch_error)."""


# ---------------------------------------------------------------------------------------------- time limit

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(value: str) -> int:
    """Seconds of a Slurm time string: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(f"slurm time_limit {value!r} is not one of M, M:S, H:M:S, D-H, D-H:M, D-H:M:S")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    assert a is not None  # the regex's one group that is not optional
    if days is not None:  # D-H[:M[:S]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None and b is not None:  # the regex gives a third field only after a second
        return a * 3600 + b * 60 + c
    return a * 60 + (b or 0)


def format_slurm_time(seconds: int) -> str:
    """D-HH:MM:SS, rounded up to whole minutes (Slurm's granularity)."""
    minutes = max(1, math.ceil(seconds / 60))
    d, rem = divmod(minutes * 60, 86400)
    return f"{d}-{rem // 3600:02d}:{rem % 3600 // 60:02d}:00"


def time_limit_s(cluster: Cluster, spec: RunSpec) -> int:
    """The run's own timeout_s, capped by the cluster's time_limit when that is shorter."""
    opts = cluster.slurm or SlurmOptions()
    limit = spec.timeout_s
    if opts.time_limit:
        limit = min(limit, parse_slurm_time(opts.time_limit))
    return limit


# ---------------------------------------------------------------------------------------------- rendering


def _no_newlines(field: str, value: str) -> str:
    if any(ch in value for ch in "\r\n\0"):
        raise ValueError(f"{field} must not contain a newline or NUL: {value!r}")
    return value


def sbatch_args(cluster: Cluster, spec: RunSpec, run_id: str, run_dir: Path) -> list[str]:
    """The sbatch argument list (the script path is appended by the caller)."""
    opts = cluster.slurm or SlurmOptions()
    lay = job_layout(cluster, spec.num_devices)
    args = [
        "--parsable",
        f"--job-name=scalebench-{run_id}",
        f"--nodes={lay.num_nodes}",
        f"--ntasks-per-node={lay.tasks_per_node}",
        f"--output={run_dir / LOG_FILE}",
        "--open-mode=append",
        f"--chdir={run_dir}",
        f"--time={format_slurm_time(time_limit_s(cluster, spec))}",
        "--no-requeue",  # node failure/preemption comes back to the service, which retries with a budget
        "--export=ALL",
    ]
    has_gres = any(a.split("=", 1)[0] == "--gres" for a in opts.extra_args)
    if lay.gpus_per_node is not None and not has_gres:
        args.append(f"--gpus-per-node={lay.gpus_per_node}")
    for flag, value in (("--partition", opts.partition), ("--account", opts.account), ("--qos", opts.qos)):
        if value:
            args.append(f"{flag}={_no_newlines(f'slurm {flag[2:]}', value)}")
    args += [_no_newlines("slurm extra_args", a) for a in opts.extra_args]
    return args


def passthrough_env(env: dict[str, str] | os._Environ) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) and ENV_NAME_RE.match(k)}


def submit_env(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """sbatch's environment: the worker's, less its secrets (database and broker URLs, tokens)."""
    return {k: v for k, v in env.items() if not SECRET_ENV_RE.match(k)}


def render_script(
    cluster: Cluster,
    spec: RunSpec,
    run_id: str,
    run_dir: Path,
    *,
    python: str,
    env: dict[str, str],
    code_dir: Path = REPO_ROOT,
) -> str:
    """The job script: literals only, each through shlex.quote; shell variables come from Slurm itself.
    code_dir (this checkout, by default) goes first on PYTHONPATH: the nodes must see it, like the run dir."""
    lay = job_layout(cluster, spec.num_devices)
    q = shlex.quote
    submitted = shlex.join(["sbatch", *sbatch_args(cluster, spec, run_id, run_dir), str(run_dir / SCRIPT_FILE)])
    lines = [
        "#!/bin/bash",
        f"# scalebench run {run_id} on cluster {cluster.name} ({cluster.vendor}, {cluster.device_name}): "
        f"N={spec.num_devices} = {lay.num_nodes} node(s) x {lay.tasks_per_node} task(s) x {lay.ranks_per_task} rank(s)",
        f"# submitted as: {submitted}",
        "set -euo pipefail",
        f"export PYTHONPATH={q(str(code_dir))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
        *(f"export {k}={q(v)}" for k, v in env.items()),
    ]
    if cluster.vendor == "cpu":
        # gloo ranks share the node's cores; oversubscribed OpenMP threads would distort throughput.
        per_node = lay.tasks_per_node * lay.ranks_per_task
        lines.append(f"omp=$(( $(nproc) / {per_node} )); export OMP_NUM_THREADS=$(( omp > 0 ? omp : 1 ))")
    lines += [
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "rdzv_port=$(( 20000 + SLURM_JOB_ID % 10000 ))  # per job: two jobs may share a first node",
        'echo "[scalebench] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: rendezvous $head_node:$rdzv_port"',
    ]
    program = program_for(spec)
    args = f"-m {q(program.module)} --spec {q(str(run_dir / SPEC_FILE))} --out {q(str(run_dir / RESULT_FILE))}"
    if program.under_torchrun:
        lines += [
            f"srun --ntasks={lay.num_tasks} --ntasks-per-node={lay.tasks_per_node} --kill-on-bad-exit=1 \\",
            f"  {q(python)} -m torch.distributed.run --nnodes={lay.num_tasks} --nproc-per-node={lay.ranks_per_task} \\",
            f'  --rdzv-backend=c10d --rdzv-endpoint="$head_node:$rdzv_port" --rdzv-id={q(run_id)} --max-restarts=0 \\',
            f"  {args}",
        ]
    else:  # a program that starts its own ranks (a command engine): once per node, told where to meet
        lines += [
            'export SCALEBENCH_MASTER_ADDR="$head_node" SCALEBENCH_MASTER_PORT="$rdzv_port"',
            f"srun --ntasks={lay.num_nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {q(python)} {args}",
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- states


@dataclass(frozen=True)
class JobState:
    state: str  # Slurm's base state, e.g. COMPLETED, TIMEOUT ("CANCELLED by 0" -> CANCELLED)
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    source: str = "scontrol"  # or "sacct"


def outcome_for_state(job: JobState, run_dir: str | Path) -> LaunchOutcome:
    """A LaunchOutcome from Slurm's view of the job and what the runner left in the run directory."""
    s = job.state
    if s in PENDING_STATES:
        return LaunchOutcome(state="pending", message=f"slurm: {s} ({job.reason or 'no reason given'})")
    if s in RUNNING_STATES:
        return LaunchOutcome(state="running", message=f"slurm: {s}")
    tail = log_tail(run_dir)
    where = f"slurm job state {s} (exit code {job.exit_code}, signal {job.signal})"
    if s == "COMPLETED":
        return outcome_from_run_dir(run_dir, job.exit_code)
    if s in ("FAILED", "SPECIAL_EXIT"):
        # ExitCode "0:9": killed by signal 9 that Slurm did not send for a limit (e.g. the host's OOM killer)
        out = outcome_from_run_dir(run_dir, -job.signal if job.signal else job.exit_code)
        out.message = f"{out.message} [{where}]"
        return out
    # Slurm ended the job: its state is the outcome (no `result`, which a worker would record instead).
    if s in ("TIMEOUT", "DEADLINE"):
        return LaunchOutcome(
            state="failed",
            error_kind="timeout",
            exit_code=job.exit_code,
            log_tail=tail,
            message=f"Slurm ended the job at its time limit: {where}",
        )
    if s == "OUT_OF_MEMORY":
        return LaunchOutcome(
            state="failed",
            error_kind="oom",
            exit_code=job.exit_code,
            log_tail=tail,
            message=f"Slurm ended the job for host memory: {where}",
        )
    if s == "CANCELLED":
        return LaunchOutcome(
            state="cancelled",
            error_kind="cancelled",
            exit_code=job.exit_code,
            log_tail=tail,
            message=f"the Slurm job was cancelled: {where}",
        )
    if s in INFRA_STATES:
        return LaunchOutcome(
            state="failed",
            error_kind="infrastructure",
            exit_code=job.exit_code,
            log_tail=tail,
            retryable=True,
            message=f"infrastructure failure: {where}",
        )
    return LaunchOutcome(
        state="failed",
        error_kind="infrastructure",
        exit_code=job.exit_code,
        log_tail=tail,
        message=f"unexpected {where}",
    )


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    m = re.match(r"^(\d+):(\d+)$", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_scontrol(text: str) -> JobState | None:
    """`scontrol show job -o ID` -> JobState (None when the output names no state)."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in fields:
        return None
    code, sig = _exit_pair(fields.get("ExitCode"))
    return JobState(fields["JobState"], code, sig, fields.get("Reason"), "scontrol")


def parse_sacct(text: str) -> JobState | None:
    """`sacct -X -n -P -o State,ExitCode,Reason -j ID` -> JobState of the newest row (None when there is none)."""
    rows = [line.strip().split("|") for line in text.splitlines()]
    rows = [r for r in rows if len(r) >= 2 and r[0]]
    if not rows:
        return None
    state, exit_text, *rest = rows[-1]
    code, sig = _exit_pair(exit_text)
    return JobState(state.split()[0], code, sig, rest[0] if rest else None, "sacct")


# ---------------------------------------------------------------------------------------------- launcher


def _run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, env=env)
    except FileNotFoundError as exc:
        raise SlurmError(f"{cmd[0]} is not installed on this worker ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{shlex.join(cmd)} did not answer within {timeout_s} s") from exc


def query_job(job_id: str, timeout_s: float = 30.0, submitted_at: float | None = None) -> JobState | None:
    """The job's state from the controller, else from accounting; None when neither knows the job.
    submitted_at (unix s) keeps sacct from answering with an older job of the same id (ids restart when
    a controller's state is wiped). Raises SlurmError when the controller cannot be asked."""
    sc = _run(["scontrol", "show", "job", "-o", job_id], timeout_s)
    if sc.returncode == 0 and (state := parse_scontrol(sc.stdout)) is not None:
        return state
    if sc.returncode != 0 and "Invalid job id" not in sc.stderr:
        raise SlurmError(f"scontrol show job {job_id}: {sc.stderr.strip() or sc.stdout.strip()}")
    # The job left the controller (MinJobAge): accounting keeps it, where slurmdbd runs.
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime((submitted_at or 0) - 300))  # clock-skew margin
    sa = _run(["sacct", "-X", "-n", "-P", "-o", "State,ExitCode,Reason", "-S", since, "-j", job_id], timeout_s)
    return parse_sacct(sa.stdout) if sa.returncode == 0 else None


class SlurmLauncher:
    """Launcher for a cluster with launcher='slurm'. Holds no state a restarted worker would miss:
    handle.json in the run directory carries the job id (attach())."""

    name = "slurm"

    def __init__(
        self,
        cluster: Cluster,
        *,
        python: str | None = None,
        env: dict[str, str] | None = None,
        command_timeout_s: float = 30.0,
        query_interval_s: float = 5.0,
    ):
        if cluster.launcher != "slurm":
            raise ValueError(f"cluster {cluster.name!r} has launcher {cluster.launcher!r}, not 'slurm'")
        self.cluster = cluster
        opts = cluster.slurm or SlurmOptions()
        self.python = python or opts.python or sys.executable
        self.env = passthrough_env(os.environ if env is None else env)
        self.command_timeout_s = command_timeout_s
        # A worker polls every ~0.5 s; slurmctld is asked at most this often per job while it waits or runs.
        self.query_interval_s = query_interval_s
        self._live: dict[str, tuple[float, JobState]] = {}  # job id -> (monotonic s, last live state)

    def run_dir_for(self, default_runs_dir: str | Path, run_id: str) -> Path:
        """Where a run's directory goes: the cluster's shared_dir when set (every node must see it)."""
        opts = self.cluster.slurm or SlurmOptions()
        return Path(opts.shared_dir or default_runs_dir) / run_id

    def start(self, spec: RunSpec, run_id: str, run_dir: Path) -> LaunchHandle:
        if not RUN_ID_RE.match(run_id):
            raise ValueError(f"run_id {run_id!r} must match {RUN_ID_RE.pattern} (it names the Slurm job)")
        run_dir = Path(run_dir).resolve()
        args = sbatch_args(self.cluster, spec, run_id, run_dir)  # validates the layout before touching disk
        script = render_script(self.cluster, spec, run_id, run_dir, python=self.python, env=self.env)
        prepare_run_dir(spec, run_id, run_dir, self.cluster, job_layout(self.cluster, spec.num_devices).num_nodes)
        (run_dir / RESULT_FILE).unlink(missing_ok=True)  # a previous attempt's result must not be read as ours
        (run_dir / SCRIPT_FILE).write_text(script)
        proc = _run(["sbatch", *args, str(run_dir / SCRIPT_FILE)], self.command_timeout_s, env=submit_env(os.environ))
        job_id = proc.stdout.strip().split(";", 1)[0]  # --parsable: "JOBID" or "JOBID;CLUSTER"
        if proc.returncode != 0 or not job_id.isdigit():
            raise SlurmError(f"sbatch refused run {run_id}: {proc.stderr.strip() or proc.stdout.strip()}")
        handle = LaunchHandle(
            run_id=run_id,
            run_dir=str(run_dir),
            launcher=self.name,
            job_id=job_id,
            started_at=time.time(),
            deadline=None,  # Slurm enforces --time; queue time is free
            extra={
                "cluster": self.cluster.name,
                "time_limit_s": time_limit_s(self.cluster, spec),
                "sbatch_args": args,
                "last_state": "PENDING",
            },
        )
        handle.save()
        log.info("run %s: submitted Slurm job %s (%s)", run_id, job_id, " ".join(args[1:4]))
        return handle

    def poll(self, handle: LaunchHandle) -> LaunchOutcome:
        assert handle.job_id, f"run {handle.run_id}: handle has no Slurm job id"
        cached = self._live.get(handle.job_id)
        if cached is not None and time.monotonic() - cached[0] < self.query_interval_s:
            return outcome_for_state(cached[1], handle.run_dir)
        try:
            job = query_job(handle.job_id, self.command_timeout_s, handle.started_at)
        except SlurmError as exc:  # controller restarting or unreachable: not the run's fault, ask again later
            log.warning("run %s: %s", handle.run_id, exc)
            last = handle.extra.get("last_state", "PENDING")
            return LaunchOutcome(
                state="pending" if last in PENDING_STATES else "running", message=f"slurm did not answer: {exc}"
            )
        if job is None:
            return self._vanished(handle)
        if job.state != handle.extra.get("last_state"):
            handle.extra["last_state"] = job.state
            handle.save()
        if job.state in PENDING_STATES or job.state in RUNNING_STATES:
            self._live[handle.job_id] = (time.monotonic(), job)
        else:
            self._live.pop(handle.job_id, None)
        return outcome_for_state(job, handle.run_dir)

    def _vanished(self, handle: LaunchHandle) -> LaunchOutcome:
        """Neither the controller nor accounting knows the job: trust result.json if the runner wrote one."""
        result, why = read_result(handle.run_dir)
        if result is not None:
            return outcome_from_run_dir(handle.run_dir, None)
        return LaunchOutcome(
            state="failed",
            error_kind="result_missing",
            log_tail=log_tail(handle.run_dir),
            message=f"Slurm has no record of job {handle.job_id} (it left the controller and "
            f"no sacct accounting answers) and {why}",
        )

    def cancel(self, handle: LaunchHandle) -> None:
        assert handle.job_id, f"run {handle.run_id}: handle has no Slurm job id"
        proc = _run(["scancel", handle.job_id], self.command_timeout_s)
        if proc.returncode != 0:  # e.g. already finished; poll() reports how it ended
            log.warning("run %s: scancel %s: %s", handle.run_id, handle.job_id, proc.stderr.strip())
        self._live.pop(handle.job_id, None)  # the next poll asks Slurm
        handle.extra["cancel_requested_at"] = time.time()
        handle.save()
        log.info("run %s: cancelled Slurm job %s", handle.run_id, handle.job_id)

    def find_job(
        self, run_id: str, run_dir: str | Path, since_s: float, newer_than_job: str | None = None
    ) -> LaunchHandle | None:
        """A job submitted for this run (job name scalebench-<run_id>, working directory run_dir) at or after
        since_s (unix s), newer than job `newer_than_job` (one whose outcome was taken), found by its name in
        the controller (squeue) or in accounting (sacct); its handle (saved as handle.json), or None.
        For a worker that died after sbatch returned and before handle.json was written: the next claim
        re-attaches to the job instead of submitting a second one. Raises SlurmError when Slurm cannot be
        asked (then nobody can tell)."""
        name, run_dir = f"scalebench-{run_id}", str(Path(run_dir).resolve())
        found = self._jobs_named(name)
        ours = [
            (int(job_id), submit_s)
            for job_id, work_dir, submit_s in found
            if work_dir == run_dir
            and submit_s >= math.floor(since_s)
            and (newer_than_job is None or int(job_id) > int(newer_than_job))
        ]
        if not ours:
            return None
        job_id, submit_s = max(ours)  # the newest submission (the one the dead worker made)
        handle = LaunchHandle(
            run_id=run_id,
            run_dir=run_dir,
            launcher=self.name,
            job_id=str(job_id),
            started_at=max(float(submit_s), since_s),
            deadline=None,
            extra={"cluster": self.cluster.name, "last_state": "PENDING", "found_by_name": name},
        )
        handle.save()
        log.warning("run %s: found Slurm job %s by its name %s (no handle.json): re-attaching", run_id, job_id, name)
        return handle

    def _jobs_named(self, name: str) -> list[tuple[str, str, int]]:
        """(job id, working directory, submit unix s) of jobs with this name, from squeue and sacct."""
        sq = _run(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i|%Z|%V"], self.command_timeout_s)
        if sq.returncode != 0:
            raise SlurmError(f"squeue --name={name}: {sq.stderr.strip() or sq.stdout.strip()}")
        rows = [line.split("|") for line in sq.stdout.splitlines()]
        # Jobs that left the controller (MinJobAge) are in accounting, where slurmdbd runs; without it sacct fails.
        sa = _run(
            ["sacct", "-X", "-n", "-P", f"--name={name}", "-S", "now-7days", "-o", "JobID,WorkDir,Submit"],
            self.command_timeout_s,
        )
        if sa.returncode == 0:
            rows += [line.split("|") for line in sa.stdout.splitlines()]
        jobs = []
        for row in rows:
            if len(row) == 3 and row[0].strip().isdigit():
                try:
                    submit_s = int(time.mktime(time.strptime(row[2].strip(), "%Y-%m-%dT%H:%M:%S")))
                except ValueError:
                    continue
                jobs.append((row[0].strip(), row[1].strip(), submit_s))
        return jobs

    def attach(self, run_dir: str | Path) -> LaunchHandle | None:
        """The handle of a job submitted earlier (by this or a previous worker) for this run directory."""
        handle = LaunchHandle.load(run_dir)
        if handle is None or handle.launcher != self.name or not handle.job_id:
            return None
        return handle
