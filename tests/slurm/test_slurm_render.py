"""Pure tests of the Slurm launcher: job layout, time limits, sbatch arguments, job script, state mapping."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from core.contracts.clusters import Cluster, SlurmOptions
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec, RunSpec
from worker.launchers import slurm
from worker.launchers.base import RESULT_FILE


def _cluster(vendor="nvidia", gpus_per_node=8, max_nodes=4, **opts) -> Cluster:
    return Cluster(
        name="c1",
        vendor=vendor,
        device_name="NVIDIA H200" if vendor == "nvidia" else "dev",
        gpus_per_node=gpus_per_node,
        max_nodes=max_nodes,
        launcher="slurm",
        slurm=SlurmOptions(**opts),
    )


def _spec(cluster: Cluster, n: int, timeout_s: int = 3600, layout: str = "fsdp") -> RunSpec:
    exp = ExperimentSpec(
        name="t",
        model="debug",
        cluster=cluster.name,
        gpu_counts=[n],
        precisions=["bf16"],
        layouts=[layout],
        seq_len=64,
        steps=4,
        warmup_steps=1,
        timeout_s=timeout_s,
    )
    runs, skipped = expand(exp, cluster)
    assert runs, skipped
    return runs[0]


@pytest.mark.parametrize("n, nodes, ranks", [(1, 1, 1), (4, 1, 4), (8, 1, 8), (16, 2, 8), (32, 4, 8)])
def test_layout_one_task_per_node(n, nodes, ranks):
    lay = slurm.job_layout(_cluster(), n)
    assert (lay.num_nodes, lay.tasks_per_node, lay.ranks_per_task, lay.gpus_per_node) == (nodes, 1, ranks, ranks)


def test_layout_refuses_uneven_and_oversized():
    with pytest.raises(ValueError, match=r"N=9 does not split evenly over 2 node\(s\)"):
        slurm.job_layout(_cluster(), 9)
    with pytest.raises(ValueError, match=r"needs 5 nodes of 8; cluster 'c1' has max_nodes\(4\)"):
        slurm.job_layout(_cluster(), 40)


def test_layout_cpu_tasks_per_node():
    c = _cluster(vendor="cpu", gpus_per_node=4, max_nodes=1, tasks_per_node=2)
    assert slurm.job_layout(c, 2) == slurm.JobLayout(1, 2, 1, None)
    assert slurm.job_layout(c, 4) == slurm.JobLayout(1, 2, 2, None)
    with pytest.raises(ValueError, match="tasks_per_node\\(2\\) > 1 is for vendor 'cpu' only"):
        slurm.job_layout(_cluster(tasks_per_node=2), 8)


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), ("1:30", 90), ("02:00:00", 7200), ("1-0", 86400), ("1-02:03", 93780), ("0-00:01:00", 60)],
)
def test_parse_slurm_time(text, seconds):
    assert slurm.parse_slurm_time(text) == seconds


def test_time_limit_is_the_shorter_and_rounds_up_to_minutes():
    with pytest.raises(ValueError, match="is not one of M, M:S"):
        slurm.parse_slurm_time("2h")
    c = _cluster(time_limit="00:30:00")
    assert slurm.time_limit_s(c, _spec(c, 8, timeout_s=3600)) == 1800
    assert slurm.time_limit_s(c, _spec(c, 8, timeout_s=61)) == 61
    assert slurm.format_slurm_time(61) == "0-00:02:00"
    assert slurm.format_slurm_time(1) == "0-00:01:00"
    assert slurm.format_slurm_time(90000) == "1-01:00:00"


def test_sbatch_args_nvidia_two_nodes(tmp_path):
    c = _cluster(partition="gpu", account="team a", qos="high", extra_args=["--exclusive", "--constraint=h200"])
    args = slurm.sbatch_args(c, _spec(c, 16), "r7", tmp_path)
    assert args[:4] == ["--parsable", "--job-name=scalebench-r7", "--nodes=2", "--ntasks-per-node=1"]
    for a in (
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=team a",
        "--qos=high",
        "--exclusive",
        "--constraint=h200",
        "--no-requeue",
        f"--output={tmp_path}/log.txt",
        "--time=0-01:00:00",
    ):
        assert a in args
    cpu = _cluster(vendor="cpu", gpus_per_node=4, max_nodes=1)
    assert not any(a.startswith("--gpus-per-node") for a in slurm.sbatch_args(cpu, _spec(cpu, 4), "r", tmp_path))
    gres = _cluster(extra_args=["--gres=gpu:8"])
    assert not any(a.startswith("--gpus-per-node") for a in slurm.sbatch_args(gres, _spec(gres, 8), "r", tmp_path))


def test_sbatch_values_with_newlines_are_refused(tmp_path):
    c = _cluster(partition="gpu\n#SBATCH --uid=0")
    with pytest.raises(ValueError, match="slurm partition must not contain a newline"):
        slurm.sbatch_args(c, _spec(c, 8), "r1", tmp_path)


def test_extra_args_outside_the_allow_list_are_refused():
    with pytest.raises(ValueError, match="'--uid' is not allowed"):
        SlurmOptions(extra_args=["--uid=0"])


def test_script_nvidia(tmp_path):
    c = _cluster()
    script = slurm.render_script(
        c, _spec(c, 16), "r7", tmp_path, python="/opt/py/bin/python", env={"NCCL_NVLS_ENABLE": "0"}
    )
    assert "export NCCL_NVLS_ENABLE=0\n" in script
    assert "srun --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert "/opt/py/bin/python -m torch.distributed.run --nnodes=2 --nproc-per-node=8" in script
    assert '--rdzv-backend=c10d --rdzv-endpoint="$head_node:$rdzv_port" --rdzv-id=r7' in script
    assert f"-m runner --spec {tmp_path}/spec.json --out {tmp_path}/result.json" in script
    assert "OMP_NUM_THREADS" not in script  # GPU ranks: leave threads to the runner


def test_script_quotes_hostile_values(tmp_path):
    """Paths and environment values reach bash as literals: a real bash parses them back unchanged."""
    c = _cluster(vendor="cpu", gpus_per_node=4, max_nodes=1, tasks_per_node=2)
    hostile = tmp_path / "a b;$(touch pwned)'x"
    env = {"NCCL_DEBUG": "$(touch pwned2) `id` \"q\" 'x'"}
    script = slurm.render_script(c, _spec(c, 4), "r1", hostile, python="/p y/python", env=env)
    assert "--nnodes=2 --nproc-per-node=2" in script and "export OMP_NUM_THREADS" in script
    probe = script.split("head_node=")[0] + 'printf "%s\\n" "$NCCL_DEBUG"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == env["NCCL_DEBUG"]
    assert not list(tmp_path.glob("pwned*"))
    words = shlex.split(script.split("srun ", 1)[1].replace("\\\n", " "))
    assert "/p y/python" in words and str(hostile / "spec.json") in words


def test_passthrough_env_keeps_collective_settings_only():
    env = {
        "NCCL_NVLS_ENABLE": "0",
        "RCCL_MSCCL_ENABLE": "1",
        "HSA_NO_SCRATCH_RECLAIM": "1",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "0",
        "SECRET_TOKEN": "x",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert slurm.passthrough_env(env) == {
        "HSA_NO_SCRATCH_RECLAIM": "1",
        "NCCL_NVLS_ENABLE": "0",
        "RCCL_MSCCL_ENABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


# ------------------------------------------------------------------------------------------- states


def _write_result(run_dir: Path, status: str, kind: str | None = None) -> None:
    doc = {"run_key": "k", "status": status}
    if status == "failed":
        doc["error"] = {"kind": kind, "message": "boom"}
    else:
        doc["summary"] = {
            "num_timed_steps": 1,
            "tokens_per_step": 64,
            "tokens_per_sec": 1.0,
            "tokens_per_sec_per_device": 1.0,
            "step_ms_median": 1.0,
            "step_ms_min": 1.0,
            "step_ms_max": 1.0,
            "flops_per_token": 1,
            "tflops_per_device": 0.0,
        }
    (run_dir / RESULT_FILE).write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "state, want",
    [("PENDING", "pending"), ("CONFIGURING", "pending"), ("RUNNING", "running"), ("COMPLETING", "running")],
)
def test_live_states(tmp_path, state, want):
    assert slurm.outcome_for_state(slurm.JobState(state), tmp_path).state == want


@pytest.mark.parametrize(
    "state, kind, retryable, outcome_state",
    [
        ("TIMEOUT", "timeout", False, "failed"),
        ("OUT_OF_MEMORY", "oom", False, "failed"),
        ("CANCELLED", "cancelled", False, "cancelled"),
        ("NODE_FAIL", "infrastructure", True, "failed"),
        ("PREEMPTED", "infrastructure", True, "failed"),
        ("BOOT_FAIL", "infrastructure", True, "failed"),
    ],
)
def test_terminal_states(tmp_path, state, kind, retryable, outcome_state):
    out = slurm.outcome_for_state(slurm.JobState(state, 0, 15), tmp_path)
    assert (out.state, out.error_kind, out.retryable) == (outcome_state, kind, retryable)
    assert state in out.message


def test_completed_reads_result_or_reports_it_missing(tmp_path):
    out = slurm.outcome_for_state(slurm.JobState("COMPLETED", 0, 0), tmp_path)
    assert (out.state, out.error_kind) == ("failed", "result_missing")
    _write_result(tmp_path, "succeeded")
    out = slurm.outcome_for_state(slurm.JobState("COMPLETED", 0, 0), tmp_path)
    assert out.state == "succeeded" and out.result is not None and out.result.summary.tokens_per_step == 64


def test_failed_uses_the_runner_error_else_the_log(tmp_path):
    (tmp_path / "log.txt").write_text("Traceback ...\nRuntimeError: rank 1 died\n")
    out = slurm.outcome_for_state(slurm.JobState("FAILED", 1, 0), tmp_path)
    assert (out.state, out.error_kind, out.exit_code) == ("failed", "error", 1)
    assert "rank 1 died" in out.log_tail and "FAILED" in out.message
    _write_result(tmp_path, "failed", "oom")
    out = slurm.outcome_for_state(slurm.JobState("FAILED", 1, 0), tmp_path)
    assert (out.error_kind, out.message.split(" [")[0]) == ("oom", "boom")


def test_slurm_end_states_win_over_a_result_file(tmp_path):
    _write_result(tmp_path, "succeeded")
    for state, kind in (("TIMEOUT", "timeout"), ("CANCELLED", "cancelled"), ("NODE_FAIL", "infrastructure")):
        out = slurm.outcome_for_state(slurm.JobState(state, 0, 15), tmp_path)
        assert (out.error_kind, out.result) == (kind, None)


def test_failed_by_a_signal_is_retryable(tmp_path):
    out = slurm.outcome_for_state(slurm.JobState("FAILED", 0, 9), tmp_path)
    assert (out.error_kind, out.retryable, out.exit_code) == ("infrastructure", True, -9)
    assert "SIGKILL" in out.message


def test_parse_scontrol_and_sacct():
    text = (
        "JobId=12 JobName=scalebench-r1 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
        "Requeue=0 ExitCode=0:15 RunTime=00:01:10"
    )
    assert slurm.parse_scontrol(text) == slurm.JobState("TIMEOUT", 0, 15, "TimeLimit", "scontrol")
    assert slurm.parse_scontrol("") is None
    assert slurm.parse_sacct("CANCELLED by 0|0:15|None\n") == slurm.JobState("CANCELLED", 0, 15, "None", "sacct")
    assert slurm.parse_sacct("OUT_OF_MEMORY|0:125|\n").state == "OUT_OF_MEMORY"
    assert slurm.parse_sacct("") is None
    assert slurm.parse_sacct("COMPLETED|0:0|None\nFAILED|2:0|NonZeroExitCode\n").state == "FAILED"  # newest last


def test_launcher_refuses_other_clusters_and_bad_run_ids(tmp_path):
    with pytest.raises(ValueError, match="has launcher 'local', not 'slurm'"):
        slurm.SlurmLauncher(Cluster(name="l", vendor="cpu", device_name="cpu", gpus_per_node=2))
    c = _cluster()
    with pytest.raises(ValueError, match="run_id 'a b' must match"):
        slurm.SlurmLauncher(c).start(_spec(c, 8), "a b", tmp_path)
    assert not (tmp_path / "spec.json").exists()


def test_submit_env_drops_the_worker_secrets():
    env = {
        "PATH": "/usr/bin",
        "SCALEBENCH_DATABASE_URL": "postgresql://u:p@h/db",
        "REDIS_URL": "redis://h",
        "DATABASE_URL": "x",
        "HF_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "NCCL_DEBUG": "INFO",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
    }
    assert slurm.submit_env(env) == {"PATH": "/usr/bin", "NCCL_DEBUG": "INFO", "SLURM_CONF": "/etc/slurm/slurm.conf"}


def test_a_program_that_starts_its_own_ranks_runs_once_per_node(tmp_path):
    """The engine decides the program; the launcher only knows 'under torchrun' or 'once per node'."""
    from core.engines.command import CommandEngineConfig

    own = CommandEngineConfig(argv=["train", "{nnodes}"], metrics="jsonl", precisions=["bf16"])
    c = _cluster().model_copy(update={"engines": {"own": own}})
    exp = ExperimentSpec(
        name="t",
        model="debug",
        cluster=c.name,
        gpu_counts=[16],
        precisions=["bf16"],
        engines=["scalebench", "command:own"],
        seq_len=64,
        steps=4,
        warmup_steps=1,
    )
    ours, theirs = expand(exp, c)[0]
    script = slurm.render_script(c, ours, "r1", tmp_path, python="/p/python", env={})
    assert "-m torch.distributed.run --nnodes=2 --nproc-per-node=8" in script and "-m runner --spec" in script
    script = slurm.render_script(c, theirs, "r2", tmp_path, python="/p/python", env={})
    assert "srun --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 /p/python -m runner.command --spec" in script
    assert "torch.distributed.run" not in script and 'SCALEBENCH_MASTER_ADDR="$head_node"' in script
