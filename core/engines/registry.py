"""The engines a run can measure, the program each starts, and what each can run on a cluster.

- `scalebench`: this service's runner, `python -m runner` under torchrun (one process per rank).
- `torchtitan`: upstream TorchTitan's own Trainer, `python -m runner.titan` under torchrun, on a cluster whose
  nodes have the `torchtitan` extra installed (`torchtitan = true` in its [[cluster]] table).
- `command:<name>`: the operator's own command (core.engines.command), started by `python -m runner.command`
  once per node; the command starts its own ranks.

The launchers (local torchrun, Slurm) start `program_for(spec)` and never branch on the engine. Every program
writes result.json (a RunResult) in the run directory. Pure: imports core only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from core.contracts.clusters import Cluster
from core.contracts.specs import MX_PRECISIONS, ParallelDegrees, RunSpec, command_name


@dataclass(frozen=True)
class Program:
    """`python -m <module> --spec spec.json --out result.json`, under torchrun (one process per rank) or,
    when under_torchrun is False, once per node (the program starts its own ranks)."""

    module: str
    under_torchrun: bool = True


# engine name (or "command" for every command:<name>) -> the program its launcher starts
PROGRAMS: dict[str, Program] = {
    "scalebench": Program("runner"),
    "torchtitan": Program("runner.titan"),
    "command": Program("runner.command", under_torchrun=False),
}


def program_for(spec: RunSpec) -> Program:
    """The program a launcher starts for this run. SCALEBENCH_RUNNER_MODULE replaces our runner with another
    training program of the same CLI (tests use it to start a program that fails on purpose)."""
    if spec.engine == "scalebench":
        return Program(os.environ.get("SCALEBENCH_RUNNER_MODULE", PROGRAMS["scalebench"].module))
    if spec.engine == "torchtitan":
        return PROGRAMS["torchtitan"]
    assert command_name(spec.engine) is not None, spec.engine  # RunSpec validated the name
    return PROGRAMS["command"]


# What engine torchtitan runs for each precision: the torchao float8 recipe TorchTitan 0.2.2's float8 Linear
# converter gets (quantize.linear.float8.recipe_name; runner.titan_config leaves the name out for tensorwise, which
# is the converter's default and its only path with the FSDP float8 all-gather), None for no converter (bf16).
# MX recipes go through its "mx" converter, which needs MX tensor cores (B200, MI355X) and is not wired here
# yet: refused with that reason.
TORCHTITAN_RECIPES: dict[str, str | None] = {
    "bf16": None,
    "fp8-tensorwise": "tensorwise",
    "fp8-rowwise": "rowwise",
    "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
}
TORCHTITAN_INSTALL_HINT = (
    "install TorchTitan on the cluster's nodes (pip install '.[torchtitan]') and set "
    "torchtitan = true in its [[cluster]] table"
)


def engine_reason(
    engine: str,
    cluster: Cluster,
    precision: str,
    layout: str,
    degrees: ParallelDegrees,
    *,
    seq_len: int | None = None,
    eval_every_steps: int = 0,
    num_layers: int | None = None,
    local_batch_size: int | None = None,
) -> str | None:
    """Why `engine` cannot run this point on `cluster`, or None. seq_len and eval_every_steps (the experiment's),
    num_layers and local_batch_size (the point's) let the rules that depend on them refuse at POST time too;
    None/0 skips those rules."""
    if engine == "scalebench":
        return scalebench_layout_reason(
            degrees, num_layers=num_layers, local_batch_size=local_batch_size, seq_len=seq_len
        )
    if engine == "torchtitan":
        if not cluster.torchtitan:
            return f"cluster {cluster.name!r} does not offer engine torchtitan: {TORCHTITAN_INSTALL_HINT}"
        return torchtitan_point_reason(
            precision, degrees, cluster.device_type, seq_len=seq_len, eval_every_steps=eval_every_steps
        )
    name = command_name(engine)
    assert name is not None, engine
    command = cluster.engines.get(name)
    if command is None:
        offered = ", ".join(f"command:{n}" for n in sorted(cluster.engines)) or "none"
        return f"cluster {cluster.name!r} defines no command engine {name!r} (its command engines: {offered})"
    if precision not in command.precisions:
        return f"command:{name} runs {', '.join(command.precisions)}, not {precision}"
    if command.layouts is not None and layout not in command.layouts:
        return f"command:{name} runs layouts {', '.join(command.layouts)}, not {layout}"
    if (degrees.pp > 1 or degrees.cp > 1) and command.layouts is None:
        return (
            f"command:{name} runs pipeline or context parallel layouts ({layout}) only where the cluster's engine "
            "lists them in its layouts"
        )
    return None


def scalebench_layout_reason(
    degrees: ParallelDegrees,
    *,
    num_layers: int | None = None,
    local_batch_size: int | None = None,
    seq_len: int | None = None,
) -> str | None:
    """Why the scalebench runner cannot execute these degrees, or None: the one rule of engine_reason (POST time)
    and runner.failures.validate (the run). Pipeline stages run runner.pipeline's 1F1B schedule of one-sequence
    micro-batches, which needs a block per stage and at least as many micro-batches as stages; context parallel
    (runner.context) cuts each sequence into 2 x cp pieces and needs a data-parallel form to average its ranks'
    gradients."""
    if degrees.cp > 1:
        if degrees.dp_mode == "none":
            # without a data-parallel wrapper nothing would average the CP ranks' gradients
            return (
                f"cp={degrees.cp} averages its ranks' gradients through the data-parallel form: use "
                f"cp={degrees.cp}+tp={degrees.tp}+fsdp, not cp={degrees.cp}+tp={degrees.tp}"
            )
        divisor = 2 * degrees.cp * degrees.tp  # 2 cp pieces, each rank's pair split again by sequence-parallel TP
        if seq_len is not None and seq_len % divisor:
            sharded = f" and tp={degrees.tp} shards a rank's pieces" if degrees.tp > 1 else ""
            return (
                f"cp={degrees.cp} cuts each sequence into {2 * degrees.cp} pieces{sharded}: seq_len({seq_len}) must "
                f"be divisible by {divisor}"
            )
    if degrees.pp == 1:
        return None
    if num_layers is not None and degrees.pp > num_layers:
        return f"pp={degrees.pp} needs a block per pipeline stage, but the model has num_layers({num_layers})"
    if local_batch_size is not None and local_batch_size < degrees.pp:
        return (
            f"pp={degrees.pp} runs a 1F1B schedule of one-sequence micro-batches, which needs at least "
            f"{degrees.pp} sequences per data-parallel rank, not {local_batch_size} (raise local_batch_size, or "
            "global_batch_size for strong scaling)"
        )
    return None


def torchtitan_point_reason(
    precision: str, degrees: ParallelDegrees, device_type: str, *, seq_len: int | None = None, eval_every_steps: int = 0
) -> str | None:
    """Why TorchTitan 0.2.2 cannot run a point as scalebench means it, or None: the one rule of engine_reason
    (POST time) and runner.titan_config (the run), so both refuse the same points. Sources: TorchTitan 0.2.2's
    tools/utils.py, distributed/utils.py, distributed/parallel_dims.py, models/llama3/infra/parallelize.py."""
    if degrees.pp > 1 or degrees.cp > 1:
        return (
            f"torchtitan runs here without pipeline or context parallelism (pp={degrees.pp}, cp={degrees.cp}): "
            "engine scalebench runs pp=P+ and cp=C+ layouts"
        )
    if device_type != "cuda":
        # tools/utils.py falls back to device "cuda" when no accelerator is found, and the Trainer's first act is
        # torch.cuda.set_device (then an NCCL process group): a CPU node fails before training.
        return "torchtitan trains on GPUs (its Trainer needs CUDA or ROCm devices), not on the CPU"
    if precision not in TORCHTITAN_RECIPES:
        mx = " (MX recipes through TorchTitan are not supported here yet)" if precision in MX_PRECISIONS else ""
        return f"torchtitan runs {', '.join(TORCHTITAN_RECIPES)}, not {precision}{mx}"
    if degrees.tp > 1 and degrees.dp_shard == 1:
        # distributed/utils.py maybe_enable_amp: without FSDP sharding, TP turns mixed precision off ("Mixed
        # precision training with TP or PP is only supported when FSDP/HSDP/CP is enabled"): the model would
        # train in fp32, not in bf16 with fp32 master weights as our runner does. (Float8 with TP itself runs
        # for every recipe: plain TP styles with the all-gathers in high precision.)
        return (
            f"torchtitan 0.2.2 turns mixed precision off under tensor parallelism without FSDP sharding "
            f"(tp={degrees.tp}, dp_shard=1): {precision} would train in fp32; use tp={degrees.tp}+fsdp on "
            f"more than {degrees.tp} devices"
        )
    if seq_len is not None and seq_len % (2 * degrees.tp):
        # parallelize_llama asserts seq_len % (tp * 2 * cp) == 0 (context parallelism's divisor, cp = 1 here)
        return f"torchtitan 0.2.2 needs seq_len divisible by 2 x tp ({2 * degrees.tp}), not {seq_len}"
    if eval_every_steps:
        # TorchTitan's validator reads its own dataset through a tokenizer; runner.data's held-out split is not
        # wired into it
        return "torchtitan runs without held-out evaluation here: set eval_every_steps 0 for engine torchtitan"
    return None


def engine_names(cluster: Cluster) -> list[str]:
    """The engines a cluster offers (GET /clusters)."""
    names = ["scalebench"] + (["torchtitan"] if cluster.torchtitan else [])
    return names + [f"command:{n}" for n in sorted(cluster.engines)]


def command_file(spec: RunSpec, cluster: Cluster, num_nodes: int) -> dict[str, Any] | None:
    """What the worker writes as command.json beside spec.json for a command engine (None for the built-in
    engines): the cluster's command, the device it runs on and the number of nodes. `python -m runner.command`
    reads it on every node. ValueError when the cluster defines no such command."""
    name = command_name(spec.engine)
    if name is None:
        return None
    if name not in cluster.engines:
        offered = ", ".join(sorted(cluster.engines)) or "none"
        raise ValueError(
            f"engine {spec.engine!r}: cluster {cluster.name!r} defines no such command (its command engines: {offered})"
        )
    return {
        "engine": spec.engine,
        "command": cluster.engines[name].model_dump(mode="json"),
        "vendor": cluster.vendor,
        "device_name": cluster.device_name,
        "num_nodes": num_nodes,
    }
