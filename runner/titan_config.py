"""A RunSpec as TorchTitan 0.2.2's job configuration: the TOML text its ConfigManager parses (pure: no torch).

`job_sections(spec, ...)` is the mapping, one commented entry per JobConfig field we set; `job_toml` renders it;
`cli_args(path)` is all TorchTitan's command line needs besides (`--job.config_file PATH`). runner.titan writes
the TOML into the run directory, parses it with TorchTitan's own ConfigManager and runs its Trainer.

What TorchTitan 0.2.2 cannot run as the RunSpec says is refused with the reason (ValueError): the point rules
(precision, degrees, device) are core.engines.registry.torchtitan_point_reason, the same function the POST-time skip
check (core.engines.registry.engine_reason) calls, so a point is refused by both or by neither; the run-level rules
(sequence length, held-out evaluation) are `run_reason` here.

The model: TorchTitan's llama3 Transformer with the dimensions of a core.catalog.shapes shape, registered under
MODEL_NAME by runner.titan_spec (TorchTitan imports it through `experimental.custom_import`, its hook for
user code). Flavor names carry the shape and the layer count: "8b_16L" is core.catalog.shapes "8b" at 16 layers.
The data: runner.titan_spec's dataloader serves runner.data's batches (the synthetic stream or data_path, by
seed, step and global sequence index), so both engines train on the same tokens; nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.catalog.shapes import MODEL_NAMES, ModelShape, get_shape
from core.contracts import data_paths
from core.contracts.specs import RunSpec
from core.engines.registry import TORCHTITAN_RECIPES, torchtitan_point_reason

TORCHTITAN_VERSION = "0.2.2"  # the version this mapping is written against (the `torchtitan` extra pins it)
MODEL_NAME = "scalebench_llama3"  # the train spec runner.titan_spec registers
SPEC_MODULE = "runner.titan_spec"  # experimental.custom_import: registers MODEL_NAME when the Trainer starts
DATASET_SYNTHETIC = "scalebench-synthetic"  # training.dataset: runner.data's synthetic stream
DATASET_FILE = "scalebench-file"  # training.dataset: runner.data's memmap of training.dataset_path
FLOAT8_CONVERTER = "quantize.linear.float8"  # TorchTitan 0.2.2's registered name of its float8 Linear converter
# The vocabulary projection stays in high precision (a substring filter on module FQNs), as in our runner and
# TorchTitan's own llama3_8b.toml.
FLOAT8_FILTER_FQNS = ["output"]
# Our runner's hyper-parameters (runner.train): AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1, grad-norm
# clipping at 1.0; TorchTitan's defaults are the same, written out so that a change of default shows here.
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
DEFAULT_COMM_TIMEOUT_S = 600  # as runner.train: SCALEBENCH_COMM_TIMEOUT_S overrides it on the node

_FLAVOR_RE = re.compile(r"^(?P<model>[a-z0-9]+)_(?P<layers>[1-9]\d*)L(?:_v(?P<vocab>[1-9]\d*))?$")


# ------------------------------------------------------------------------------------------------ model


def flavor_name(model: str, num_layers: int, vocab_size: int | None = None) -> str:
    """model.flavor of a shape at a layer count, and a vocabulary when the RunSpec overrides it: "8b_16L",
    "1b_2L_v23000"."""
    return f"{model}_{num_layers}L" + (f"_v{vocab_size}" if vocab_size else "")


def shape_of_flavor(flavor: str) -> ModelShape:
    """The core.catalog.shapes shape a flavor name stands for; ValueError naming the allowed form."""
    m = _FLAVOR_RE.match(flavor)
    if not m or m["model"] not in MODEL_NAMES:
        raise ValueError(
            f"model.flavor {flavor!r} is not <shape>_<layers>L[_v<vocab>] with shape one of {', '.join(MODEL_NAMES)}"
        )
    return get_shape(m["model"], int(m["layers"]), int(m["vocab"]) if m["vocab"] else None)


def model_args(shape: ModelShape) -> dict[str, Any]:
    """Keyword arguments of TorchTitan's llama3 TransformerModelArgs for a shape.

    The FFN width comes out the same: TorchTitan sizes it as core.catalog.shapes does (2/3 of 4*dim, times
    ffn_dim_multiplier, rounded up to multiple_of). RoPE: our model applies no Llama-3.1 frequency scaling;
    TorchTitan scales by default (factor 8), and a factor of 1 leaves every frequency as it is, so
    runner.titan_spec passes RoPEScalingArgs(scaling_factor=1.0) (`rope_scaling_factor` here)."""
    return {
        "dim": shape.dim,
        "n_layers": shape.num_layers,
        "n_heads": shape.num_heads,
        "n_kv_heads": shape.num_kv_heads,
        "vocab_size": shape.vocab_size,
        "multiple_of": shape.multiple_of,
        "ffn_dim_multiplier": shape.ffn_dim_multiplier,
        "norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling_factor": 1.0,
    }


# --------------------------------------------------------------------------------------------- refusals


def run_reason(spec: RunSpec) -> str | None:
    """Why TorchTitan 0.2.2 cannot run this RunSpec as it says, or None."""
    reason = torchtitan_point_reason(
        spec.precision, spec.degrees, spec.device_type, seq_len=spec.seq_len, eval_every_steps=spec.eval_every_steps
    )
    return reason


def check(spec: RunSpec) -> None:
    if reason := run_reason(spec):
        raise ValueError(reason)


# ---------------------------------------------------------------------------------------------- mapping


def lr_scheduler(spec: RunSpec) -> dict[str, Any]:
    """TorchTitan's lr_scheduler section for runner.train.lr_factor's schedule.

    Both warm up linearly over lr_warmup_steps ((step + 1) / warmup). constant: decay_ratio 0 gives TorchTitan no
    decay steps (its default decays linearly over all the steps after the warm-up). cosine (ours: 0.1 + 0.9 x
    half a cosine over the steps after the warm-up): decay_ratio left unset decays over all of them, cosine, to
    min_lr_factor 0.1; TorchTitan's one "stable" step is the first after the warm-up, where both give 1."""
    if spec.lr_schedule == "cosine":
        return {"warmup_steps": spec.lr_warmup_steps, "decay_type": "cosine", "min_lr_factor": 0.1}
    return {"warmup_steps": spec.lr_warmup_steps, "decay_ratio": 0.0, "decay_type": "linear", "min_lr_factor": 0.0}


def job_sections(
    spec: RunSpec, *, dump_folder: str, comm_timeout_s: int = DEFAULT_COMM_TIMEOUT_S, log_freq: int | None = None
) -> dict[str, dict[str, Any]]:
    """TorchTitan 0.2.2 JobConfig sections for one run ({"training": {"seq_len": 2048, ...}, ...}).

    dump_folder: TorchTitan's output directory (the run directory's `titan/`); comm_timeout_s: the process
    group's timeout, at start-up and in training; log_freq: steps between TorchTitan's metric log lines (each
    one a CPU-GPU sync), default as our runner's (a tenth of the run). ValueError when TorchTitan 0.2.2
    cannot run the spec."""
    check(spec)
    d = spec.degrees
    recipe = TORCHTITAN_RECIPES[spec.precision]
    float8 = recipe is not None
    sections: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": dump_folder, "description": f"scalebench run {spec.run_key()}"},
        # Traces: runner.titan times steps itself; TorchTitan's profiler stays off (profile_steps is not mapped).
        "profiling": {"enable_profiling": False, "enable_memory_snapshot": False},
        "metrics": {
            "log_freq": log_freq or max(1, spec.steps // 10),
            "enable_tensorboard": False,
            "enable_wandb": False,
            "disable_color_printing": True,
        },
        "model": {
            "name": MODEL_NAME,
            "flavor": flavor_name(spec.model, spec.num_layers, spec.vocab_size),
            # No tokenizer is built (the train spec has none); an existing directory keeps ConfigManager quiet.
            "hf_assets_path": dump_folder,
            # bf16: no converter; fp8-*: TorchTitan's float8 Linear converter (torchao Float8Linear)
            "converters": [FLOAT8_CONVERTER] if float8 else [],
        },
        "optimizer": {
            "name": "AdamW",
            "lr": spec.lr,
            "beta1": ADAMW_BETAS[0],
            "beta2": ADAMW_BETAS[1],
            "eps": ADAMW_EPS,
            "weight_decay": WEIGHT_DECAY,
            # fused on GPUs, as our runner
            "implementation": "fused" if spec.device_type == "cuda" else "foreach",
        },
        "lr_scheduler": lr_scheduler(spec),
        "training": {
            "dataset": DATASET_FILE if spec.data_path else DATASET_SYNTHETIC,
            # the resolved file inside the data roots (runner.titan_spec opens it as runner.data does)
            **({"dataset_path": str(data_paths.resolve(spec.data_path, spec.data_roots))} if spec.data_path else {}),
            "local_batch_size": spec.local_batch_size,  # sequences per data-parallel rank
            # explicit: one micro-batch a step (no gradient accumulation), as our runner
            "global_batch_size": spec.global_batch_size,
            "seq_len": spec.seq_len,
            "steps": spec.steps,
            "max_norm": MAX_GRAD_NORM,
            # fp32 master weights; FSDP casts them to bf16 for compute (MixedPrecisionPolicy) and reduces
            # gradients in fp32; without FSDP TorchTitan trains under torch.autocast(bf16), as our runner
            "dtype": "float32",
            "mixed_precision_param": "bfloat16",
            "mixed_precision_reduce": "float32",
        },
        "parallelism": {
            # From spec.degrees (they multiply to the world size): FSDP = dp_shard N; HSDP = dp_replicate R x
            # dp_shard S; DDP = dp_replicate N (TorchTitan replicates when dp_shard is 1 and dp_replicate > 1);
            # TP = tensor_parallel T (with FSDP: dp_shard N/T). Explicit degrees: TorchTitan's dp_shard -1
            # ("the rest") is not used.
            "data_parallel_replicate_degree": d.dp_replicate,
            "data_parallel_shard_degree": d.dp_shard,
            "tensor_parallel_degree": d.tp,
            "context_parallel_degree": 1,
            "pipeline_parallel_degree": 1,
            "expert_parallel_degree": 1,
        },
        "checkpoint": {"enable": False},  # nothing written but the result
        "activation_checkpoint": {"mode": spec.activation_checkpointing},  # none | full (same names)
        # Per-block torch.compile plus the compiled loss, as our runner's `compile`.
        "compile": {"enable": spec.compile, "components": ["model", "loss"]},
        "comm": {"init_timeout_seconds": comm_timeout_s, "train_timeout_seconds": comm_timeout_s},
        "validation": {"enable": False},  # eval_every_steps > 0 is refused (run_reason)
        "debug": {"seed": spec.seed, "deterministic": False},
        "experimental": {"custom_import": SPEC_MODULE},
    }
    if float8:
        sections["quantize.linear.float8"] = {
            # tensorwise is TorchTitan's float8 path without a recipe name: only there does it honour the FSDP
            # float8 all-gather and the precomputed scales (with a recipe name it asserts the all-gather is
            # off); torchao's tensorwise recipe is that same default Float8LinearConfig.
            **({"recipe_name": recipe} if recipe != "tensorwise" else {}),
            # TorchTitan applies it only when FSDP shards (dp_shard > 1), as our runner does
            "enable_fsdp_float8_all_gather": spec.fp8_all_gather,
            "precompute_float8_dynamic_scale_for_fsdp": spec.precompute_fp8_scales,
            "filter_fqns": FLOAT8_FILTER_FQNS,
            "emulate": False,  # GPUs with float8 tensor cores only (the point rule refuses the CPU)
        }
    return sections


def job_toml(
    spec: RunSpec, *, dump_folder: str, comm_timeout_s: int = DEFAULT_COMM_TIMEOUT_S, log_freq: int | None = None
) -> str:
    """The TOML text of job_sections, with a header naming the run."""
    sections = job_sections(spec, dump_folder=dump_folder, comm_timeout_s=comm_timeout_s, log_freq=log_freq)
    head = (
        f"# TorchTitan {TORCHTITAN_VERSION} job for scalebench run {spec.run_key()}: {spec.model} "
        f"x{spec.num_layers} layers, {spec.precision}, {spec.layout} on {spec.num_devices} devices\n"
    )
    return head + render_toml(sections)


def cli_args(toml_path: str) -> list[str]:
    """TorchTitan's command line for the job: everything is in the file."""
    return ["--job.config_file", toml_path]


def render_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML of {section: {key: value}} (section names may be dotted tables: "quantize.linear.float8")."""
    out = []
    for name, values in sections.items():
        out.append(f"\n[{name}]")
        out += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(out).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}: {value!r}")
