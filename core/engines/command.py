"""The operator's command engines: a training command defined per cluster in the clusters file.

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
  whatever it uses); scalebench starts it once per node and reads its metrics (core.engines.logs).

Pure: imports core only.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from core.contracts.base import Strict
from core.contracts.specs import ENGINE_NAME_RE, PRECISIONS, RunSpec

COMMAND_FILE = "command.json"  # a command engine's launch, beside spec.json: written by the worker, read on the node
MetricsSource = Literal["jsonl", "megatron-log", "torchtitan-log"]
METRICS_SOURCES: tuple[str, ...] = get_args(MetricsSource)

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
    "dim": "model width",
    "ffn_hidden_dim": "MLP width",
    "num_heads": "attention heads",
    "num_kv_heads": "key/value heads",
    "vocab_size": "vocabulary size",
    "seq_len": "tokens per sequence",
    "local_batch_size": "sequences per data-parallel rank",
    "global_batch_size": "sequences per step over all ranks",
    "steps": "training steps",
    "warmup_steps": "untimed leading steps",
    "precision": "bf16, fp8-tensorwise, ...",
    "precision_args": "the precision's argument list (whole argument)",
    "tp": "tensor-parallel degree",
    "dp_shard": "FSDP shard degree",
    "dp_replicate": "replicas (DDP/HSDP)",
    "seed": "the run's seed",
    "lr": "peak learning rate",
    "lr_warmup_steps": "LR warm-up steps",
    "compile": "true/false",
    "activation_checkpointing": "none/full",
    "data_path": "pre-tokenized data file ('' when synthetic)",
    "run_dir": "the run's directory (write metrics.jsonl here)",
    "code_dir": "the scalebench checkout on the node (scripts shipped with it, e.g. examples/)",
    "metrics_file": "where a jsonl metrics source is read",
}


class CommandEngineConfig(Strict):
    """A training command of the operator's, defined for one cluster ([cluster.engines.<name>])."""

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
    def _known_placeholders(self) -> CommandEngineConfig:
        texts = [
            *self.argv,
            self.metrics_file,
            *self.env.values(),
            self.cwd or "",
            *(a for args in self.precision_args.values() for a in args),
        ]
        unknown = sorted({name for t in texts for name in placeholders_in(t)} - PLACEHOLDERS.keys())
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
                f"allowed: {', '.join(PLACEHOLDERS)}"
            )
        if any("{precision_args}" in a and a != "{precision_args}" for a in self.argv):
            raise ValueError("{precision_args} must be a whole argument of argv (it expands to a list)")
        for args in (self.argv, *self.precision_args.values()):
            check_no_code_placeholders(args)
        bad = [p for p in self.precision_args if p not in self.precisions]
        if bad:
            raise ValueError(f"precision_args names {', '.join(bad)}, not in this engine's precisions")
        return self


# Programs that run an argument as code, and the flag that says which argument: a placeholder inside that code
# would be read as code (`/x; echo INJECTED` in a data path), so templates pass values as arguments instead.
# Each pattern matches the flag argument; group 1 is code given in the same argument (python -c'code').
_SHELLS = ("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "fish", "csh", "tcsh", "busybox")
_SHELL_FLAG = re.compile(r"^[-+][a-zA-Z]*c[a-zA-Z]*()$")  # -c, -ec, -lc, -xc
_CODE_FLAGS: dict[str, re.Pattern[str]] = {
    **dict.fromkeys(_SHELLS, _SHELL_FLAG),
    "python": re.compile(r"^-[bBdEiIOPqsSuvx]*c(.*)$"),
    "perl": re.compile(r"^-[aclnpstuwWX0-9]*[eE](.*)$"),
    "ruby": re.compile(r"^-[adlnpsvwW]*e(.*)$"),
    "node": re.compile(r"^(?:-e|-p|--eval|--print)(?:=(.*))?$"),
}
# Options of theirs that take the next argument as a value (so it is not the script file ending the options).
_VALUE_OPTIONS = ("-o", "+o", "-O", "+O", "-W", "-X", "-I", "-r", "--require")
_VERSIONED_RE = re.compile(r"^([a-z]+?)[0-9.]*$")  # python3.12, perl5 -> python, perl


def _interpreter(arg: str) -> str | None:
    m = _VERSIONED_RE.match(arg.rsplit("/", 1)[-1])
    return m.group(1) if m and m.group(1) in _CODE_FLAGS else None


def _code_refused(i: int, arg: str, interpreter: str) -> ValueError:
    names = placeholders_in(arg)
    placeholder = "{" + (names[0] if names else "...") + "}"
    return ValueError(
        f"argv[{i}] {arg!r}: {placeholder} is inside the code that {interpreter} runs, where a value would be read "
        f"as code; pass it as an argument after the code and quote it there, e.g. "
        f'["sh", "-c", "train \\"$1\\"", "sh", "{placeholder}"]'
    )


def check_no_code_placeholders(argv: list[str]) -> None:
    """ValueError when a placeholder sits inside the code of `sh -c CODE` (bash, zsh, `env sh -c`, python -c,
    perl -e, ...). Elsewhere a placeholder is safe inside a longer argument: argv goes to the program without a
    shell, so a value never splits into words; only a program that reads an argument as code re-parses it."""
    interpreter: str | None = None
    code_next = skip_value = False
    for i, arg in enumerate(argv):
        if skip_value:
            skip_value = False
            continue
        if code_next:
            if placeholders_in(arg):
                raise _code_refused(i, arg, interpreter or "the shell")
            interpreter, code_next = None, False  # what follows the code are its arguments
            continue
        if name := _interpreter(arg):
            interpreter = name
            continue
        if interpreter is None:
            continue
        if m := _CODE_FLAGS[interpreter].match(arg):
            if m.group(1):
                if placeholders_in(m.group(1)):
                    raise _code_refused(i, arg, interpreter)
                interpreter = None
            else:
                code_next = True
        elif arg in _VALUE_OPTIONS:
            skip_value = True
        elif not arg.startswith(("-", "+")):
            interpreter = None  # a script file: the rest are its arguments


def placeholders_in(text: str) -> list[str]:
    """Names of the {placeholders} in a template (`{{` is a literal brace); ValueError on a malformed one."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"template {text!r}: {exc}") from exc


def template_values(
    spec: RunSpec, *, nnodes: int, node_rank: int, master_addr: str, master_port: int, run_dir: str, code_dir: str = ""
) -> dict[str, str]:
    """The value of every placeholder for one run (strings, as they go into argv)."""

    shape = spec.shape
    d = spec.degrees
    values = {
        "num_devices": d.world_size,
        "nproc_per_node": d.world_size // nnodes,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "master_addr": master_addr,
        "master_port": master_port,
        "model": spec.model,
        "num_layers": shape.num_layers,
        "dim": shape.dim,
        "ffn_hidden_dim": shape.ffn_hidden_dim,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "vocab_size": shape.vocab_size,
        "seq_len": spec.seq_len,
        "local_batch_size": spec.local_batch_size,
        "global_batch_size": spec.global_batch_size,
        "steps": spec.steps,
        "warmup_steps": spec.warmup_steps,
        "precision": spec.precision,
        "tp": d.tp,
        "dp_shard": d.dp_shard,
        "dp_replicate": d.dp_replicate,
        "seed": spec.seed,
        "lr": spec.lr,
        "lr_warmup_steps": spec.lr_warmup_steps,
        "compile": str(spec.compile).lower(),
        "activation_checkpointing": spec.activation_checkpointing,
        "data_path": spec.data_path or "",
        "run_dir": run_dir,
        "code_dir": code_dir,
    }
    out = {k: str(v) for k, v in values.items()}
    out["metrics_file"] = ""  # filled by render_command once the template of the file itself is rendered
    return out


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def render_command(engine: CommandEngineConfig, spec: RunSpec, values: dict[str, str]) -> dict[str, Any]:
    """The launch of one run: argv (with {precision_args} expanded), env, cwd, metrics source and file."""
    values = dict(values)
    values["metrics_file"] = _fill(engine.metrics_file, values)
    argv: list[str] = []
    for arg in engine.argv:
        if arg == "{precision_args}":
            argv += [_fill(a, values) for a in engine.precision_args.get(spec.precision, [])]
        else:
            argv.append(_fill(arg, values))
    return {
        "argv": argv,
        "env": {k: _fill(v, values) for k, v in engine.env.items()},
        "cwd": _fill(engine.cwd, values) if engine.cwd else values["run_dir"],
        "metrics": engine.metrics,
        "metrics_file": values["metrics_file"],
    }


def check_command_names(engines: dict[str, CommandEngineConfig]) -> dict[str, CommandEngineConfig]:
    bad = [n for n in engines if not ENGINE_NAME_RE.match(n)]
    if bad:
        raise ValueError(f"engine name(s) {', '.join(map(repr, bad))}: lowercase letters, digits, '.', '_', '-'")
    return engines
