"""The contracts that travel unchanged: request -> DB (JSON) -> spec.json -> runner -> result.json -> DB.

ExperimentSpec: what a user asks for (a matrix). RunSpec: one resolved point of it. RunResult: what the
runner writes. One home for each; every other package imports them from here.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.analysis.breakdown import Breakdown
from core.catalog.shapes import MODEL_NAMES, ModelShape, get_shape
from core.contracts.base import Strict
from core.contracts.data_paths import PATH_CHARS
from core.contracts.data_paths import check_form as check_data_path_form
from core.contracts.stacks import RUNNER_ENGINES, STACK_FORM, format_stack, parse_stack

SCHEMA_VERSION = 1
# The fields a request gave, while an ExperimentSpec validates (ExperimentSpec._note_given_fields).
_GIVEN_FIELDS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("given_fields", default=None)
MAX_PROFILE_STEPS = 20  # profiled steps per run: each adds a few MB of trace per rank on a GPU

Precision = Literal[
    "bf16",
    "fp8-tensorwise",
    "fp8-rowwise",
    "fp8-rowwise-gw-hp",
    "mxfp8-cublas",
    "mxfp8-cublas-floor",
    "mxfp8-emulated",
    "fp32",
]
PRECISIONS: tuple[str, ...] = get_args(Precision)
# torchao.float8 recipes (per-tensor or per-row scales; any GPU with float8 tensor cores)
FLOAT8_PRECISIONS: tuple[str, ...] = ("fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp")
# torchao 0.18 MXFP8 training (torchao.prototype.moe_training MXFP8TrainingOpConfig): e4m3 elements with one
# power-of-two (e8m0) scale per 32 elements. mxfp8-cublas: KernelPreference.AUTO (torchao's cast kernels, the
# block-scaled cuBLAS GEMM through torch._scaled_mm: MX tensor cores only), RCEIL scales (torchao 0.18's recipe
# mxfp8_rceil); mxfp8-cublas-floor: the same kernels with FLOOR scales (the OCP MX spec's rounding);
# mxfp8-emulated: KernelPreference.EMULATED (recipe mxfp8_emulated_rceil: quantize, dequantize, bf16 GEMM), which
# runs anywhere and is for numerics, not speed.
MX_PRECISIONS: tuple[str, ...] = ("mxfp8-cublas", "mxfp8-cublas-floor", "mxfp8-emulated")
# every 8-bit float recipe: compared with bf16 for the speedup, refused for fp8 all-gather unless tensorwise
FP8_PRECISIONS: tuple[str, ...] = FLOAT8_PRECISIONS + MX_PRECISIONS
ModelName = Literal["debug", "1b", "8b", "70b", "405b"]
ScalingMode = Literal["weak", "strong"]
DpMode = Literal["none", "fsdp", "hsdp", "ddp"]

# Run failure kinds. The runner writes the first four; workers and launchers add the rest.
ErrorKind = Literal[
    "invalid_config",
    "oom",
    "comm_timeout",
    "error",  # runner
    "timeout",
    "worker_lost",
    "cancelled",
    "launch_error",
    "infrastructure",
    "result_missing",  # service
    "no_metrics",  # a command engine's command printed no metric its parser could read
]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)

LAYOUT_FORMS = (
    "fsdp, ddp, hsdp:shard=S, tp=T, tp=T+fsdp, each optionally after pp=P+ and/or cp=C+ "
    "(pp=4+tp=2+fsdp, cp=2+fsdp, pp=2+cp=2+fsdp; S, T, P, C positive integers)"
)
# Engines: the training stack a run measures. scalebench: our runner (python -m runner); torchtitan: upstream
# TorchTitan's own Trainer (the `torchtitan` extra on the cluster's nodes); command:<name>: a command the
# operator defined for the cluster in its clusters file ([cluster.engines.<name>]); a request names it, never
# carries it.
DEFAULT_ENGINE = "scalebench"
ENGINE_FORMS = "scalebench, torchtitan, command:<name> (a command engine of the cluster, GET /clusters)"
ENGINE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_LAYOUT_RE = re.compile(
    r"^(?:pp=([1-9]\d*)\+)?(?:cp=([1-9]\d*)\+)?(?:(fsdp)|(ddp)|hsdp:shard=([1-9]\d*)|tp=([1-9]\d*)(\+fsdp)?)$"
)


# ------------------------------------------------------------------------------------------- storable text


# Bidirectional controls reorder what is shown (U+202E makes "exp-fp8\u202e61fb" display as "exp-fp8bf16"), and
# these invisible characters make two names that look the same differ: neither belongs in a stored name.
# (ZWJ and ZWNJ stay allowed: scripts and emoji need them.)
_BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_HIDDEN_RE = re.compile(f"[{_BIDI_CONTROLS}\u200b\u2060-\u2064\ufeff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored (PostgreSQL refuses NUL; UTF-8 cannot encode a lone surrogate; a bidirectional
    control or an invisible character makes one name display as another), else None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate (not valid UTF-8)"
    if "\x00" in value:
        return "contains a NUL character"
    if hidden := _HIDDEN_RE.search(value):
        ch = hidden.group()
        if re.match(f"[{_BIDI_CONTROLS}]", ch):
            return f"contains the bidirectional control U+{ord(ch):04X} (it can make one name display as another)"
        return f"contains the invisible character U+{ord(ch):04X}"
    return None


def check_text(value: str) -> str:
    if problem := text_problem(value):
        raise ValueError(problem)
    return value


def bad_values(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, reason) of every string that cannot be stored and every float that is not finite, in a JSON-like
    value (dicts, lists, scalars); paths read `a.b[0]`."""
    if isinstance(value, str):
        problem = text_problem(value)
        return [(path, problem)] if problem else []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, f"{value} is not a finite number")]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            key_path = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and (problem := text_problem(k)):
                out.append((key_path, f"key {problem}"))
            out += bad_values(v, key_path)
        return out
    if isinstance(value, (list, tuple)):
        return [e for i, v in enumerate(value) for e in bad_values(v, f"{path}[{i}]")]
    return []


def storable(value: Any) -> Any:
    """`value` with every non-finite float as None and every unstorable string repaired (NUL dropped, lone
    surrogates replaced): what a reader gets of a value that is somehow bad in the store."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        if text_problem(value) is None:
            return value
        return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


# A string the store can hold: valid UTF-8 (no lone surrogate) without NUL.
Text = Annotated[str, AfterValidator(check_text)]
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def check_line(value: str) -> str:
    """A name or tag is one line of text: no CR, LF or other control character (a log or a header line that
    shows it must not be split or forged by it)."""
    if hit := _CONTROL_RE.search(value):
        raise ValueError(f"contains the control character U+{ord(hit.group()):04X}; names and tags are one line")
    return value


# A name or a tag: storable text on one line.
Line = Annotated[str, AfterValidator(check_text), AfterValidator(check_line)]
# A tag: a Line of 1 to 64 characters (the lengths first, so that their error is the one a long tag gets).
Tag = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(check_text), AfterValidator(check_line)]


# ----------------------------------------------------------------------------------------------- engines


def check_engine(engine: str) -> str:
    """Normalize an engine name or raise ValueError naming the allowed forms."""
    e = engine.strip()
    if e in ("scalebench", "torchtitan"):
        return e
    kind, sep, name = e.partition(":")
    if kind == "command" and sep and ENGINE_NAME_RE.match(name):
        return e
    raise ValueError(
        f"engine {engine!r} is not one of: {ENGINE_FORMS}; a command name is lowercase letters, "
        "digits, '.', '_' or '-' (at most 63)"
    )


def command_name(engine: str) -> str | None:
    """`megatron` of `command:megatron`; None for the built-in engines."""
    return engine.partition(":")[2] if engine.startswith("command:") else None


# ----------------------------------------------------------------------------------------------- layouts


class ParallelDegrees(Strict):
    """Parallel degrees of one run; they multiply to the world size (the one validated home)."""

    dp_mode: DpMode
    dp_replicate: int = Field(ge=1)
    dp_shard: int = Field(ge=1)
    tp: int = Field(ge=1)
    world_size: int = Field(ge=1)
    # Pipeline stages and context-parallel ranks (the layout's pp=P+ and cp=C+); the data-parallel and TP degrees
    # are those of one stage's CP rank, so world = pp * cp * dp_replicate * dp_shard * tp.
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _product_is_world_size(self) -> ParallelDegrees:
        if self.pp * self.cp * self.dp_replicate * self.dp_shard * self.tp != self.world_size:
            raise ValueError(
                f"pp({self.pp}) * cp({self.cp}) * dp_replicate({self.dp_replicate}) * dp_shard({self.dp_shard}) "
                f"* tp({self.tp}) != world size({self.world_size})"
            )
        if self.dp_mode == "ddp" and self.dp_shard != 1:
            raise ValueError(f"dp_mode ddp needs dp_shard(1), got dp_shard({self.dp_shard})")
        return self

    @property
    def dp_degree(self) -> int:
        """Number of data-parallel ranks (each sees its own batch)."""
        return self.dp_replicate * self.dp_shard


def check_layout(template: str) -> str:
    """Normalize a layout template or raise ValueError naming the allowed forms."""
    t = template.strip().lower().replace(" ", "")
    if not _LAYOUT_RE.match(t):
        raise ValueError(f"layout {template!r} is not one of: {LAYOUT_FORMS}")
    return t


def rank_degrees(template: str) -> tuple[int, int, int]:
    """(pp, cp, tp) of a layout template: the degrees that do not scale with N (1 where the template has none)."""
    m = _LAYOUT_RE.match(check_layout(template))
    assert m is not None
    pp_text, cp_text, _, _, _, tp, _ = m.groups()
    return int(pp_text or 1), int(cp_text or 1), int(tp or 1)


def model_parallel_size(template: str) -> int:
    """Devices one data-parallel rank spans under a layout template: pp x cp x tp (1 for fsdp, ddp and hsdp)."""
    pp, cp, tp = rank_degrees(template)
    return pp * cp * tp


def resolve_layout(template: str, num_devices: int) -> ParallelDegrees:
    """Degrees of a layout template at N devices; ValueError with the reason when the point cannot exist.

    `pp=P+` and `cp=C+` take P pipeline stages and C context-parallel ranks out of N first; the rest of the
    template lays out the N / (P C) devices of one stage's context-parallel rank."""
    m = _LAYOUT_RE.match(check_layout(template))
    assert m is not None
    pp_text, cp_text, fsdp, ddp, shard, tp, tp_fsdp = m.groups()
    pp, cp = int(pp_text or 1), int(cp_text or 1)
    if num_devices % (pp * cp):
        raise ValueError(f"pp({pp}) x cp({cp}) = {pp * cp} does not divide {num_devices} devices")
    n = num_devices // (pp * cp)
    extra = {"pp": pp, "cp": cp, "world_size": num_devices}
    if fsdp:
        return ParallelDegrees(dp_mode="fsdp", dp_replicate=1, dp_shard=n, tp=1, **extra)
    if ddp:
        return ParallelDegrees(dp_mode="ddp", dp_replicate=n, dp_shard=1, tp=1, **extra)
    if shard:
        s = int(shard)
        if s > n or n % s:
            raise ValueError(f"hsdp shard size {s} does not divide {n} devices")
        return ParallelDegrees(dp_mode="hsdp", dp_replicate=n // s, dp_shard=s, tp=1, **extra)
    t = int(tp)
    if n % t:
        raise ValueError(f"tp degree {t} does not divide {n} devices")
    if tp_fsdp:
        return ParallelDegrees(dp_mode="fsdp", dp_replicate=1, dp_shard=n // t, tp=t, **extra)
    if n != t:
        raise ValueError(f"layout tp={t} uses exactly {t} devices, not {n} (use tp={t}+fsdp to scale)")
    return ParallelDegrees(dp_mode="none", dp_replicate=1, dp_shard=1, tp=t, **extra)


def check_profile_steps(steps: int, warmup_steps: int, profile_steps: int) -> None:
    """At least one timed step must remain besides warm-up and the profiled steps."""
    if profile_steps and steps - warmup_steps - profile_steps < 1:
        raise ValueError(
            f"profile_steps({profile_steps}) leaves no timed step: steps({steps}) - warmup_steps({warmup_steps}) "
            f"- profile_steps({profile_steps}) must be at least 1"
        )


# ------------------------------------------------------------------------------------------ experiment


# an experiment's `stacks`: command engine -> its stack, 'field=value,...' (core.contracts.stacks)
EngineStacks = Annotated[
    dict[Annotated[str, Field(max_length=80)], Annotated[str, Field(max_length=400)]], Field(max_length=8)
]


class ExperimentSpec(Strict):
    """One experiment: a matrix of precisions x layouts x GPU counts x repeats on one cluster."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "name": "llama3-8b fsdp fp8 scaling",
                    "model": "8b",
                    "num_layers": 16,
                    "cluster": "h200-pod",
                    "gpu_counts": [8, 16, 32, 64],
                    "precisions": ["bf16", "fp8-tensorwise", "fp8-rowwise"],
                    "layouts": ["fsdp", "tp=2+fsdp"],
                    "scaling": "weak",
                    "seq_len": 8192,
                    "local_batch_size": 1,
                    "steps": 30,
                    "warmup_steps": 5,
                    "repeats": 2,
                    "compile": True,
                    "fp8_all_gather": True,
                    "tags": ["nightly"],
                }
            ]
        },
    )

    name: Line = Field(min_length=1, max_length=200, description="Human-readable experiment name.")
    model: ModelName = Field(description=f"Named Llama-3 shape: {', '.join(MODEL_NAMES)}.")
    num_layers: StrictInt | None = Field(None, ge=1, le=256, description="Override of the shape's layer count.")
    vocab_size: StrictInt | None = Field(
        None,
        ge=256,
        le=1 << 20,
        description=(
            "Override of the shape's vocabulary size: the tokenizer's, for a data_path built with another "
            "tokenizer (e.g. `python -m runner.corpus build`, ~23k tokens); its tokens must be below it."
        ),
    )
    cluster: Text = Field("local-cpu", min_length=1, max_length=100, description="Cluster name (GET /clusters).")
    gpu_counts: list[Annotated[StrictInt, Field(ge=1, le=65536)]] = Field(
        min_length=1, max_length=32, description="Device counts N to measure (each a point of the curve)."
    )
    precisions: list[Precision] = Field(min_length=1, max_length=5, description="Precisions to compare.")
    layouts: list[Text] = Field(
        ["fsdp"],
        min_length=1,
        max_length=8,
        description=(
            f"Parallelism layout templates that scale with N: {LAYOUT_FORMS}. Engine scalebench runs pp=P+ as a 1F1B "
            "pipeline of one-sequence micro-batches (at least P sequences per data-parallel rank) and cp=C+ by "
            "gathering keys and values (seq_len divisible by 2C x T; with fsdp, hsdp or ddp); other pp/cp points, "
            "and pp/cp on other engines, are skipped with the reason (they still project: /projection, /plan)."
        ),
    )
    engines: list[Annotated[Text, Field(max_length=80)]] = Field(
        [DEFAULT_ENGINE],
        min_length=1,
        max_length=8,
        description=(
            f"Training stacks to measure, an axis of the matrix like precisions: {ENGINE_FORMS}. "
            "`scalebench` is this service's runner; `torchtitan` runs upstream TorchTitan's own Trainer on a "
            "cluster that offers it; `command:<name>` runs a command the operator defined for the cluster in "
            "its clusters file. A request names an engine; it never carries a command line. S(N) and E(N) "
            "compare within one engine; the engine ratio compares engines at the same N, precision and layout."
        ),
    )
    stacks: EngineStacks = Field(
        {},
        description=(
            "How the stack of each command engine moves and schedules its data-parallel traffic, for the "
            "projection and the plan (GET /experiments/{id}/projection): {engine: 'field=value,...'}, e.g. "
            "{'command:megatron': 'distributed_optimizer=true,grad_reduce_bytes=2,dp_buckets=megatron'}; "
            f"{STACK_FORM}. Fields not given keep the scalebench runner's, which the scalebench and torchtitan "
            "engines run; an engine without an entry is projected with the runner's stack."
        ),
    )
    scaling: ScalingMode = Field("weak", description="weak: fixed local batch; strong: fixed global batch.")
    seq_len: StrictInt = Field(2048, ge=16, le=131072, description="Tokens per sequence.")
    local_batch_size: StrictInt | None = Field(
        None,
        ge=1,
        le=4096,
        validate_default=True,
        description="Sequences per data-parallel rank (weak scaling; default 1).",
    )
    global_batch_size: StrictInt | None = Field(
        None, ge=1, le=1 << 20, validate_default=True, description="Sequences per step over all ranks (strong scaling)."
    )
    steps: StrictInt = Field(20, ge=2, le=100000, description="Training steps per run, warm-up included.")
    warmup_steps: StrictInt = Field(
        5, ge=0, validate_default=True, description="Leading steps excluded from timing (below steps)."
    )
    profile_steps: StrictInt = Field(
        0,
        ge=0,
        le=MAX_PROFILE_STEPS,
        description=(
            "Last steps of each run recorded with torch.profiler on every rank (0: off), left out of the "
            "throughput figures; the run gets a step-time breakdown and a trace (GET /runs/{id}/trace)."
        ),
    )
    repeats: StrictInt = Field(1, ge=1, le=20, description="Repeats of every point (throughput is their median).")
    compile: StrictBool = Field(False, description="torch.compile each transformer block.")
    activation_checkpointing: Literal["none", "full"] = Field("none", description="Activation checkpointing.")
    fp8_all_gather: StrictBool = Field(False, description="FSDP float8 all-gather (tensorwise only).")
    precompute_fp8_scales: StrictBool = Field(
        False, validate_default=True, description="Precompute float8 dynamic scales for FSDP (tensorwise all-gather)."
    )
    lr: float = Field(3e-4, gt=0, le=1.0, allow_inf_nan=False, strict=True, description="Peak AdamW learning rate.")
    lr_warmup_steps: StrictInt = Field(0, ge=0, le=100000, description="Linear LR warm-up steps.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="After the warm-up: constant, or cosine decay to 10% of the peak at the last step."
    )
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="Seed of every run (use `seeds` for several).")
    seeds: list[Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description=(
            "Seeds, an axis of the matrix: every point runs once per seed (and per repeat). Throughput is the "
            "median over seeds and repeats; the fp8 loss verdict uses the seed-to-seed spread. Default: [seed]."
        ),
    )
    eval_every_steps: StrictInt = Field(
        0,
        ge=0,
        le=100000,
        description=(
            "Evaluate the loss on held-out data every this many steps and after the last (0: off). Eval steps "
            "are outside the timed steps. Held-out data: the `.val` split beside data_path, or held-out "
            "sequences of the synthetic stream."
        ),
    )
    eval_batches: StrictInt = Field(2, ge=1, le=256, description="Batches per evaluation (per data-parallel rank).")
    data_path: Annotated[Text, AfterValidator(check_data_path_form)] | None = Field(
        None,
        max_length=1000,
        description=(
            "Pre-tokenized uint16/uint32 token file, relative to one of the cluster's data_roots (default: the "
            f"synthetic stream; a cluster without data roots offers only that). Characters: {PATH_CHARS}."
        ),
    )
    timeout_s: StrictInt = Field(3600, ge=10, le=7 * 24 * 3600, description="Wall-clock limit of one run.")
    tags: list[Tag] = Field([], max_length=32)

    @field_validator("gpu_counts")
    @classmethod
    def _unique_sorted(cls, v: list[int]) -> list[int]:
        return sorted(set(v))

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(check_engine(e) for e in v))

    @field_validator("stacks")
    @classmethod
    def _stacks(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        engines = info.data.get("engines")
        if engines is None:
            return v  # engines failed their own validation
        out = {}
        for engine, raw in v.items():
            if engine in RUNNER_ENGINES:
                raise ValueError(f"{engine!r} runs the scalebench runner's stack: describe command engines only")
            if engine not in engines:
                raise ValueError(f"{engine!r} is not one of the experiment's engines ({', '.join(engines)})")
            try:
                out[engine] = format_stack(parse_stack(raw))
            except ValueError as exc:
                raise ValueError(f"{engine}: {exc}") from None
        return out

    @field_validator("precisions")
    @classmethod
    def _unique_precisions(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("layouts")
    @classmethod
    def _layouts(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(check_layout(t) for t in v))

    # Cross-field rules are field validators (each sees the fields declared before it in info.data), so that
    # the error names its field: `warmup_steps`, not `body`. A field that failed its own validation is absent
    # from info.data; then the rule is skipped (that field's error is reported instead).

    @model_validator(mode="wrap")
    @classmethod
    def _note_given_fields(cls, data: Any, handler: Any) -> Any:
        # which fields the request gave, for messages that say a value was the default (field validators see
        # only values; an explicit `warmup_steps: 5` and the default 5 are equal)
        token = _GIVEN_FIELDS.set(frozenset(data) if isinstance(data, dict) else None)
        try:
            return handler(data)
        finally:
            _GIVEN_FIELDS.reset(token)

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_below_steps(cls, v: int, info: ValidationInfo) -> int:
        # validate_default: the default (5) is checked against steps too, and the message says it was the default
        steps = info.data.get("steps")
        if steps is not None and v >= steps:
            given = _GIVEN_FIELDS.get()
            default = " (the default)" if given is not None and "warmup_steps" not in given else ""
            raise ValueError(
                f"warmup_steps({v}){default} must be below steps({steps}); set warmup_steps between 0 and {steps - 1}"
            )
        return v

    @field_validator("lr_warmup_steps")
    @classmethod
    def _lr_warmup_within_steps(cls, v: int, info: ValidationInfo) -> int:
        steps = info.data.get("steps")
        if steps is not None and v > steps:
            raise ValueError(f"lr_warmup_steps({v}) must be at most steps({steps}); set it between 0 and {steps}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v is None:
            return None
        if info.data.get("seed", 0) != 0:
            raise ValueError("seeds and seed are exclusive: list every seed in seeds")
        return list(dict.fromkeys(v))

    @field_validator("profile_steps")
    @classmethod
    def _profile_leaves_timed_steps(cls, v: int, info: ValidationInfo) -> int:
        steps, warmup_steps = info.data.get("steps"), info.data.get("warmup_steps")
        if steps is not None and warmup_steps is not None:
            check_profile_steps(steps, warmup_steps, v)
        return v

    @field_validator("local_batch_size")
    @classmethod
    def _local_batch_for_weak(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("scaling") == "strong":
            raise ValueError("local_batch_size applies to scaling 'weak'; use global_batch_size for 'strong'")
        return v

    @field_validator("global_batch_size")
    @classmethod
    def _global_batch_for_strong(cls, v: int | None, info: ValidationInfo) -> int | None:
        scaling = info.data.get("scaling")
        if scaling == "strong" and v is None:
            raise ValueError("global_batch_size is required for scaling 'strong'")
        if scaling == "weak" and v is not None:
            raise ValueError("global_batch_size applies to scaling 'strong'; use local_batch_size for 'weak'")
        return v

    @property
    def seed_list(self) -> list[int]:
        """The seeds the matrix runs: `seeds`, else [seed]."""
        return self.seeds if self.seeds is not None else [self.seed]

    @field_validator("precompute_fp8_scales")
    @classmethod
    def _precompute_needs_all_gather(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("fp8_all_gather") is False:
            raise ValueError("precompute_fp8_scales needs fp8_all_gather: true")
        return v


# --------------------------------------------------------------------------------------------- run


class RunSpec(Strict):
    """One fully resolved point of an experiment; what the runner reads from spec.json."""

    schema_version: int = SCHEMA_VERSION
    engine: str = DEFAULT_ENGINE
    model: ModelName
    num_layers: int = Field(ge=1)
    vocab_size: int | None = Field(None, ge=1)  # None: the shape's
    precision: Precision
    layout: str
    degrees: ParallelDegrees
    scaling: ScalingMode
    seq_len: int = Field(ge=1)
    local_batch_size: int = Field(ge=1)
    steps: int = Field(ge=2)
    warmup_steps: int = Field(ge=0)
    profile_steps: int = Field(0, ge=0, le=MAX_PROFILE_STEPS)  # the last steps, profiled; not in the run key
    compile: bool = False
    activation_checkpointing: Literal["none", "full"] = "none"
    fp8_all_gather: bool = False
    precompute_fp8_scales: bool = False
    lr: float = 3e-4
    lr_warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    seed: int = 0
    data_path: str | None = None  # relative to one of data_roots (core.contracts.data_paths)
    data_roots: list[str] = []  # the cluster's, when the run was expanded; not in the run key
    eval_every_steps: int = Field(0, ge=0)
    eval_batches: int = Field(2, ge=1)
    device_type: Literal["cpu", "cuda"] = "cpu"
    timeout_s: int = 3600
    # Not part of the run key: where and which repeat.
    cluster: str = "local-cpu"
    repeat: int = Field(0, ge=0)

    @property
    def num_devices(self) -> int:
        return self.degrees.world_size

    @property
    def shape(self) -> ModelShape:
        """The model's dimensions: the named shape with the layer and vocabulary overrides."""
        return get_shape(self.model, self.num_layers, self.vocab_size)

    @property
    def global_batch_size(self) -> int:
        return self.local_batch_size * self.degrees.dp_degree

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @model_validator(mode="after")
    def _fp8_all_gather_recipe(self) -> RunSpec:
        if self.fp8_all_gather and self.precision != "fp8-tensorwise":
            raise ValueError(f"fp8_all_gather works only with fp8-tensorwise, not {self.precision}")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps({self.warmup_steps}) must be below steps({self.steps})")
        check_profile_steps(self.steps, self.warmup_steps, self.profile_steps)
        return self

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        return check_engine(v)

    def run_key(self) -> str:
        """Stable hash of the normalized spec without cluster and repeat: equal keys are comparable runs.
        profile_steps is left out: profiled steps are not in the throughput figures. Fields added after the
        first schema (engine, eval_*, lr_schedule, vocab_size) enter the hash only when they differ from their
        default, so the key of a run that does not use them is what it always was (history stays comparable)."""
        payload = self.model_dump(
            mode="json", exclude={"cluster", "repeat", "timeout_s", "profile_steps", "data_roots"}
        )
        for name, default in _KEY_DEFAULTS.items():
            if payload.get(name) == default:
                payload.pop(name)
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


_KEY_DEFAULTS: dict[str, Any] = {
    "engine": DEFAULT_ENGINE,
    "eval_every_steps": 0,
    "eval_batches": 2,
    "lr_schedule": "constant",
    "vocab_size": None,
}


# ------------------------------------------------------------------------------------------ result


class EvalPoint(Strict):
    step: int = Field(ge=0)  # the training step after which the held-out loss was measured
    loss: float | None = None
    num_tokens: int = Field(0, ge=0)  # held-out tokens it averages over (all ranks)


class StepRecord(Strict):
    step: int = Field(ge=0)
    loss: float | None = None
    step_ms: float | None = Field(None, ge=0)
    tokens: int = Field(0, ge=0)
    grad_norm: float | None = None
    lr: float | None = None
    warmup: bool = False  # excluded from timing


class Summary(Strict):
    num_timed_steps: int
    tokens_per_step: int
    tokens_per_sec: float  # global
    tokens_per_sec_per_device: float
    step_ms_median: float
    step_ms_min: float
    step_ms_max: float
    flops_per_token: int
    tflops_per_device: float
    bf16_peak_tflops: float | None = None
    precision_peak_tflops: float | None = None
    mfu_vs_bf16_peak: float | None = None  # fraction, 0..1
    mfu_vs_precision_peak: float | None = None  # fraction, against the precision's own peak
    mfu_note: str | None = None  # why MFU is absent, when it is
    peak_memory_allocated_gib: float | None = None  # max over ranks
    peak_memory_reserved_gib: float | None = None
    num_float8_linears: int | None = None
    # How step times were measured: "optimizer-step hook" (scalebench, torchtitan: wall time between optimizer
    # steps, after a device sync), or "log:<parser>" / "jsonl" for a command engine (the command's own figures).
    step_time_source: str | None = None


class Numerics(Strict):
    final_loss: float | None = None
    loss_curve: list[float] = []
    eval_curve: list[EvalPoint] = []  # held-out loss every eval_every_steps (empty when off)
    data: str | None = None  # "synthetic", or the data file's name and sha256 (its recipe is beside it)


class Environment(Strict):
    vendor: Literal["nvidia", "amd", "cpu"]
    device_name: str
    device_count: int
    gcn_arch: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    hip_version: str | None = None
    torch_version: str
    torchao_version: str | None = None
    nccl_version: str | None = None  # RCCL reports through the same API on ROCm
    python_version: str | None = None
    hosts: list[str] = []
    world_size: int
    backend: str | None = None
    fp8_dtypes: list[str] = []
    engine: str | None = None  # scalebench, torchtitan, command:<name>
    torchtitan_version: str | None = None


class RunError(Strict):
    kind: ErrorKind
    message: str = Field(max_length=20000)
    traceback_tail: str | None = None
    memory: dict[str, float] | None = None  # oom: allocated/reserved/total GiB at failure


class RunResult(Strict):
    schema_version: int = SCHEMA_VERSION
    run_key: str
    status: Literal["succeeded", "failed"]
    steps: list[StepRecord] = []
    summary: Summary | None = None
    numerics: Numerics | None = None
    environment: Environment | None = None
    error: RunError | None = None
    breakdown: Breakdown | None = None  # step time by category, when the run was profiled (core.analysis.breakdown)

    @model_validator(mode="after")
    def _status_matches(self) -> RunResult:
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed result needs an error (kind and message)")
        if self.status == "succeeded" and self.summary is None:
            raise ValueError("a succeeded result needs a summary")
        return self
