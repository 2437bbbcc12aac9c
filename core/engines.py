"""Engines: which training stack a run measures, what each can run, and the operator's command engines.

- `scalebench`: this service's runner (`python -m runner` under torchrun).
- `torchtitan`: upstream TorchTitan's own Trainer (`python -m runner.titan` under torchrun), on a cluster whose
  nodes have the `torchtitan` extra installed (`torchtitan = true` in its [[cluster]] table).
- `command:<name>`: a command the operator defines for a cluster in the clusters file, e.g.

      [cluster.engines.megatron]
      argv = ["bash", "/opt/megatron/train.sh", "{nproc_per_node}", "{seq_len}", "{precision_args}"]
      metrics = "megatron-log"          # or "torchtitan-log", or "jsonl" (a file the command writes)
      precisions = ["bf16", "fp8-tensorwise"]
      precision_args = { "fp8-tensorwise" = ["--fp8-format", "hybrid"] }

  The command comes only from that file: an API request names the engine, never a program. Placeholders
  (PLACEHOLDERS) are filled from the RunSpec when the run is launched; `{precision_args}` as a whole argument
  expands to the list given for the run's precision. The command is its own launcher (it starts torchrun or
  whatever it uses); scalebench starts it once per node and reads its metrics (core.engine_metrics).

Pure: imports core only. The worker side (what program to start) is worker/engines/.
"""

from __future__ import annotations

import re
import string
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.specs import MX_PRECISIONS, PRECISIONS, ParallelDegrees, RunSpec, command_name

if TYPE_CHECKING:
    from core.clusters import Cluster

COMMAND_FILE = "command.json"  # a command engine's launch, beside spec.json: written by the worker, read on the node
MetricsSource = Literal["jsonl", "megatron-log", "torchtitan-log"]
METRICS_SOURCES: tuple[str, ...] = ("jsonl", "megatron-log", "torchtitan-log")

# What an argv template may name: each is filled from the RunSpec (and the launch) when the run starts.
PLACEHOLDERS: dict[str, str] = {
    "num_devices": "N, the world size",
    "nproc_per_node": "ranks per node",
    "nnodes": "nodes of the run",
    "node_rank": "this node's index (0 on a one-node run)",
    "master_addr": "the first node's host name (rendezvous)",
    "master_port": "a free rendezvous port on the first node",
    "model": "the named shape (debug, 1b, 8b, 70b, 405b)",
    "num_layers": "layers of the model",
    "dim": "model width", "ffn_hidden_dim": "MLP width", "num_heads": "attention heads",
    "num_kv_heads": "key/value heads", "vocab_size": "vocabulary size",
    "seq_len": "tokens per sequence",
    "local_batch_size": "sequences per data-parallel rank",
    "global_batch_size": "sequences per step over all ranks",
    "steps": "training steps", "warmup_steps": "untimed leading steps",
    "precision": "bf16, fp8-tensorwise, ...", "precision_args": "the precision's argument list (whole argument)",
    "tp": "tensor-parallel degree", "dp_shard": "FSDP shard degree", "dp_replicate": "replicas (DDP/HSDP)",
    "seed": "the run's seed", "lr": "peak learning rate", "lr_warmup_steps": "LR warm-up steps",
    "compile": "true/false", "activation_checkpointing": "none/full",
    "data_path": "pre-tokenized data file ('' when synthetic)",
    "run_dir": "the run's directory (write metrics.jsonl here)",
    "code_dir": "the scalebench checkout on the node (scripts shipped with it, e.g. examples/)",
    "metrics_file": "where a jsonl metrics source is read",
}


class CommandEngine(BaseModel):
    """A training command of the operator's, defined for one cluster ([cluster.engines.<name>])."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1, description="Program and arguments; {placeholders} filled per run.")
    metrics: MetricsSource = Field(description=f"Where the step metrics come from: {', '.join(METRICS_SOURCES)}.")
    metrics_file: str = Field("{run_dir}/metrics.jsonl", description="The JSON-lines file of the jsonl source.")
    precisions: list[str] = Field(["bf16"], min_length=1, description="Precisions the command can run.")
    precision_args: dict[str, list[str]] = Field({}, description="Arguments per precision ({precision_args}).")
    layouts: list[str] | None = Field(None, description="Layout templates it can run (default: any).")
    env: dict[str, str] = Field({}, description="Extra environment of the command.")
    cwd: str | None = Field(None, description="Working directory (default: the run directory).")
    description: str = ""

    @field_validator("precisions")
    @classmethod
    def _known_precisions(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if p not in PRECISIONS]
        if bad:
            raise ValueError(f"precisions: {', '.join(map(repr, bad))} not among: {', '.join(PRECISIONS)}")
        return v

    @model_validator(mode="after")
    def _known_placeholders(self) -> CommandEngine:
        texts = [*self.argv, self.metrics_file, *self.env.values(), self.cwd or "",
                 *(a for args in self.precision_args.values() for a in args)]
        unknown = sorted({name for t in texts for name in placeholders_in(t)} - PLACEHOLDERS.keys())
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
                             f"allowed: {', '.join(PLACEHOLDERS)}")
        if any("{precision_args}" in a and a != "{precision_args}" for a in self.argv):
            raise ValueError("{precision_args} must be a whole argument of argv (it expands to a list)")
        bad = [p for p in self.precision_args if p not in self.precisions]
        if bad:
            raise ValueError(f"precision_args names {', '.join(bad)}, not in this engine's precisions")
        return self


def placeholders_in(text: str) -> list[str]:
    """Names of the {placeholders} in a template (`{{` is a literal brace); ValueError on a malformed one."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"template {text!r}: {exc}") from exc


def template_values(spec: RunSpec, *, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                    run_dir: str, code_dir: str = "") -> dict[str, str]:
    """The value of every placeholder for one run (strings, as they go into argv)."""

    shape = spec.shape
    d = spec.degrees
    values = {
        "num_devices": d.world_size, "nproc_per_node": d.world_size // nnodes, "nnodes": nnodes,
        "node_rank": node_rank, "master_addr": master_addr, "master_port": master_port,
        "model": spec.model, "num_layers": shape.num_layers, "dim": shape.dim,
        "ffn_hidden_dim": shape.ffn_hidden_dim, "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads, "vocab_size": shape.vocab_size,
        "seq_len": spec.seq_len, "local_batch_size": spec.local_batch_size,
        "global_batch_size": spec.global_batch_size, "steps": spec.steps, "warmup_steps": spec.warmup_steps,
        "precision": spec.precision, "tp": d.tp, "dp_shard": d.dp_shard, "dp_replicate": d.dp_replicate,
        "seed": spec.seed, "lr": spec.lr, "lr_warmup_steps": spec.lr_warmup_steps,
        "compile": str(spec.compile).lower(), "activation_checkpointing": spec.activation_checkpointing,
        "data_path": spec.data_path or "", "run_dir": run_dir, "code_dir": code_dir,
    }
    out = {k: str(v) for k, v in values.items()}
    out["metrics_file"] = ""  # filled by render_command once the template of the file itself is rendered
    return out


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def render_command(engine: CommandEngine, spec: RunSpec, values: dict[str, str]) -> dict:
    """The launch of one run: argv (with {precision_args} expanded), env, cwd, metrics source and file."""
    values = dict(values)
    values["metrics_file"] = _fill(engine.metrics_file, values)
    argv: list[str] = []
    for arg in engine.argv:
        if arg == "{precision_args}":
            argv += [_fill(a, values) for a in engine.precision_args.get(spec.precision, [])]
        else:
            argv.append(_fill(arg, values))
    return {"argv": argv, "env": {k: _fill(v, values) for k, v in engine.env.items()},
            "cwd": _fill(engine.cwd, values) if engine.cwd else values["run_dir"],
            "metrics": engine.metrics, "metrics_file": values["metrics_file"]}


# ---------------------------------------------------------------------------------------- what can run

# What engine torchtitan runs for each precision: the torchao float8 recipe TorchTitan 0.2.2's float8 Linear
# converter gets (quantize.linear.float8.recipe_name; core.titan_config leaves the name out for tensorwise, which
# is the converter's default and its only path with the FSDP float8 all-gather), None for no converter (bf16).
# MX recipes go through its "mx" converter, which needs MX tensor cores (B200, MI355X) and is not wired here
# yet: refused with that reason.
TORCHTITAN_RECIPES: dict[str, str | None] = {
    "bf16": None, "fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise",
    "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
}
TORCHTITAN_INSTALL_HINT = ("install TorchTitan on the cluster's nodes (pip install '.[torchtitan]') and set "
                           "torchtitan = true in its [[cluster]] table")


def engine_reason(engine: str, cluster: Cluster, precision: str, layout: str, degrees: ParallelDegrees, *,
                  seq_len: int | None = None, eval_every_steps: int = 0) -> str | None:
    """Why `engine` cannot run this point on `cluster`, or None. seq_len and eval_every_steps (the experiment's)
    let the torchtitan rules that depend on them refuse at POST time too; None/0 skips those rules."""
    if engine == "scalebench":
        return None
    if engine == "torchtitan":
        if not cluster.torchtitan:
            return f"cluster {cluster.name!r} does not offer engine torchtitan: {TORCHTITAN_INSTALL_HINT}"
        return torchtitan_point_reason(precision, degrees, cluster.device_type, seq_len=seq_len,
                                       eval_every_steps=eval_every_steps)
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
    return None


def torchtitan_point_reason(precision: str, degrees: ParallelDegrees, device_type: str, *,
                            seq_len: int | None = None, eval_every_steps: int = 0) -> str | None:
    """Why TorchTitan 0.2.2 cannot run a point as scalebench means it, or None: the one rule of engine_reason
    (POST time) and core.titan_config (the run), so both refuse the same points. Sources: TorchTitan 0.2.2's
    tools/utils.py, distributed/utils.py, distributed/parallel_dims.py, models/llama3/infra/parallelize.py."""
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
        return (f"torchtitan 0.2.2 turns mixed precision off under tensor parallelism without FSDP sharding "
                f"(tp={degrees.tp}, dp_shard=1): {precision} would train in fp32; use tp={degrees.tp}+fsdp on "
                f"more than {degrees.tp} devices")
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


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def check_command_names(engines: dict[str, CommandEngine]) -> dict[str, CommandEngine]:
    bad = [n for n in engines if not _NAME_RE.match(n)]
    if bad:
        raise ValueError(f"engine name(s) {', '.join(map(repr, bad))}: lowercase letters, digits, '.', '_', '-'")
    return engines
