"""Request schemas of the imports (api/routers/imports.py): points measured elsewhere (POST /experiments/import)
and training logs of runs made elsewhere (POST /experiments/import/logs).

A point's loss curve and held-out curve land where the service's own runs keep theirs (the loss-curve table
and the result's numerics), so the fp8 loss verdict, the loss charts and every other reader treat an imported
run as a measured one. A point names its engine (the stack that ran it) and its seed: the verdict pairs an fp8
run with the bf16 run of the same engine and seed, and reads the seed-to-seed spread from several seeds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)

from api.schemas.experiments import ExperimentRead, RunBrief
from core.contracts.specs import (
    EngineStacks,
    Line,
    ModelName,
    Precision,
    ScalingMode,
    Tag,
    Text,
    check_engine,
    check_layout,
)
from core.engines.logs import LOG_FORMATS

MAX_POINTS = 4096
MAX_CURVE_POINTS = 10_000  # per point (training loss; held-out loss too)
MAX_TOTAL_CURVE_POINTS = 500_000
MAX_STEP = 99_999  # an experiment holds at most 100,000 steps (ExperimentSpec.steps)
MAX_LOGS = 256
MAX_LOG_CHARS = 32 << 20  # one log's text; the whole body is capped by SCALEBENCH_MAX_IMPORT_BODY_BYTES too

Step = Annotated[StrictInt, Field(ge=0, le=MAX_STEP)]
LossPair = tuple[Step, float]


_PLAIN_CURVE = TypeAdapter(list[float], config=ConfigDict(allow_inf_nan=False))


def _as_pairs(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A loss curve given as plain numbers is step 0, 1, 2, ... (validated as numbers, so that an error names
    loss_curve[i]); given as [step, loss] pairs it is taken as is. One form per curve (a mixed list is refused:
    which step would a bare number be?)."""
    if not isinstance(value, list) or not value:
        return handler(value)
    pairs = [isinstance(v, (list, tuple)) for v in value]
    if not any(pairs):
        return handler(list(enumerate(_PLAIN_CURVE.validate_python(value))))
    if not all(pairs):
        raise ValueError("give every value as a number (step 0, 1, 2, ...) or every value as a [step, loss] pair")
    return handler(value)


def _ordered_steps(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    ordered = sorted(pairs, key=lambda p: p[0])
    for (a, _), (b, _) in zip(ordered, ordered[1:]):
        if a == b:
            raise ValueError(f"step {a} appears twice")
    return ordered


_PAIR_SCHEMA = {
    "type": "array",
    "prefixItems": [{"type": "integer", "minimum": 0, "maximum": MAX_STEP}, {"type": "number"}],
    "minItems": 2,
    "maxItems": 2,
}
LossCurve = Annotated[
    list[LossPair],
    WrapValidator(_as_pairs),
    AfterValidator(_ordered_steps),
    Field(max_length=MAX_CURVE_POINTS),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": {"type": "number"}, "maxItems": MAX_CURVE_POINTS},
                {"type": "array", "items": _PAIR_SCHEMA, "maxItems": MAX_CURVE_POINTS},
            ]
        }
    ),
]
EvalCurve = Annotated[list[LossPair], AfterValidator(_ordered_steps), Field(max_length=MAX_CURVE_POINTS)]
Engine = Annotated[str, Field(max_length=80), AfterValidator(check_engine)]
Seed = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
Repeat = Annotated[StrictInt, Field(ge=0, le=19)]

ENGINE_DESCRIPTION = (
    "The stack that trained it, as an experiment's engines name them: scalebench, torchtitan or command:<name> "
    "(e.g. command:megatron, command:primus). A label here: an imported run is not checked against what the "
    "cluster offers. S(N) and the fp8 loss verdict pair runs of one engine."
)
SEED_DESCRIPTION = (
    "The run's seed. The fp8 loss verdict pairs an fp8 run with the bf16 run of the same engine and seed and, "
    "with two or more seeds, widens its band by the seed-to-seed spread."
)


class ImportPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_devices: StrictInt = Field(ge=1, le=65536)
    precision: Precision
    layout: str = Field(description="Layout template, e.g. fsdp, hsdp:shard=8, tp=2+fsdp.")
    engine: Engine = Field("scalebench", description=ENGINE_DESCRIPTION)
    seed: Seed = Field(0, description=SEED_DESCRIPTION)
    tokens_per_sec: float | None = Field(None, gt=0, description="Global tokens/s (give this or the per-device value).")
    tokens_per_sec_per_device: float | None = Field(None, gt=0, description="Tokens/s per device (e.g. TPS/GPU).")
    step_ms: float | None = Field(
        None,
        gt=0,
        description="Median step time; default derived from tokens per step and the throughput. When given, within "
        "5% of that (a 422 otherwise).",
    )
    peak_memory_gib: float | None = Field(None, ge=0)
    final_loss: float | None = Field(None, description="Default: the last value of loss_curve.")
    loss_curve: LossCurve = Field(
        [],
        description=(
            "Training loss per step: plain numbers (step 0 first, one per step) or [step, loss] pairs (any steps, "
            f"e.g. every 10th; steps from 0 to {MAX_STEP}, each once). Stored like a measured run's curve (thinned "
            "to 2,000 points when longer), so the fp8 loss verdict and /losses read it."
        ),
    )
    eval_curve: EvalCurve = Field(
        [],
        description=(
            "Held-out loss as [step, loss] pairs, step = the training step after which it was measured (from 0). "
            "The fp8 loss verdict prefers it when every paired run has two or more in the last quarter of its steps."
        ),
    )
    environment: dict[str, Any] = Field({}, description="core.contracts.specs.Environment fields (torch_version, ...).")
    repeat: Repeat = 0

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        return check_layout(v)

    @model_validator(mode="after")
    def _one_throughput(self) -> ImportPoint:
        if (self.tokens_per_sec is None) == (self.tokens_per_sec_per_device is None):
            raise ValueError("give exactly one of tokens_per_sec (global) or tokens_per_sec_per_device")
        return self

    def throughput_field(self) -> str:
        """The throughput field this point gives (an error about the throughput names it)."""
        return "tokens_per_sec" if self.tokens_per_sec is not None else "tokens_per_sec_per_device"

    def global_tokens_per_sec(self) -> float:
        return self.tokens_per_sec or self.tokens_per_sec_per_device * self.num_devices  # type: ignore[operator]

    def num_steps(self) -> int:
        """Steps the run trained, as far as its curves tell (at least 2, an experiment's minimum)."""
        last = max([p[0] for p in self.loss_curve[-1:]] + [p[0] for p in self.eval_curve[-1:]], default=-1)
        return max(2, last + 1)


class ImportHead(BaseModel):
    """What every point of an imported experiment shares."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    name: Line = Field(min_length=1, max_length=200)
    model: ModelName
    num_layers: int | None = Field(None, ge=1, le=256)
    cluster: Text = Field(
        min_length=1,
        max_length=63,
        description="A configured cluster, or a new name (then vendor and device_name are required).",
    )
    vendor: Literal["nvidia", "amd", "cpu"] | None = None
    device_name: Text | None = Field(
        None, min_length=1, max_length=200, description="Device name; MFU is computed when the peak table knows it."
    )
    scaling: ScalingMode = "weak"
    seq_len: int = Field(2048, ge=16, le=131072)
    local_batch_size: int | None = Field(None, ge=1, le=4096)
    global_batch_size: int | None = Field(None, ge=1, le=1 << 20)
    compile: bool = False
    activation_checkpointing: Literal["none", "full"] = "none"
    fp8_all_gather: bool = False
    stacks: EngineStacks = Field(
        {},
        description=(
            "How the stack of each command engine the points name moves and schedules its data-parallel traffic, "
            "for the projection: {engine: 'field=value,...'}, e.g. {'command:megatron': "
            "'distributed_optimizer=true,grad_reduce_bytes=2,dp_buckets=megatron'} (an experiment's `stacks`). "
            "An engine without an entry is projected with the scalebench runner's stack."
        ),
    )
    tags: list[Tag] = Field([], max_length=31)


class ExperimentImport(ImportHead):
    points: list[ImportPoint] = Field(min_length=1, max_length=MAX_POINTS)


class ImportLog(BaseModel):
    """One run's training log and the point it measured."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[LOG_FORMATS] = Field(  # type: ignore[valid-type]
        description=(
            "megatron: Megatron-LM's (and AMD Primus-Megatron's) iteration lines (`iteration N/ M | ... | elapsed "
            "time per iteration (ms): ... | ... lm loss: ... |`) and `validation loss at iteration N | lm loss "
            "value: ...`; torchtitan: TorchTitan's `step: N  loss: X  ...  tps: ...` lines (colour codes as it "
            "prints them) and `validate step: N  loss: X`; jsonl: one JSON object a line, {step, step_ms or "
            "tokens_per_sec, loss, eval_loss}. Megatron's iterations and TorchTitan's steps count from 1: they "
            "are stored from step 0 (iteration 100 is step 99)."
        )
    )
    text: str = Field(min_length=1, max_length=MAX_LOG_CHARS, description="The log's text (other lines are ignored).")
    num_devices: StrictInt = Field(ge=1, le=65536)
    precision: Precision
    layout: str = Field("fsdp", description="Layout template, e.g. fsdp, hsdp:shard=8, tp=2+fsdp.")
    engine: Engine | None = Field(
        None,
        description=ENGINE_DESCRIPTION + " Default: torchtitan for a torchtitan log, command:megatron for a megatron "
        "log, scalebench for jsonl.",
    )
    seed: Seed = Field(0, description=SEED_DESCRIPTION)
    repeat: Repeat = 0
    warmup_steps: StrictInt = Field(
        1,
        ge=0,
        le=MAX_STEP,
        description=(
            "Logged steps left out of the throughput (the first carries compilation and start-up); at least one "
            "logged step is always timed."
        ),
    )
    environment: dict[str, Any] = Field({}, description="core.contracts.specs.Environment fields (torch_version, ...).")

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        return check_layout(v)


class LogsImport(ImportHead):
    logs: list[ImportLog] = Field(
        min_length=1,
        max_length=MAX_LOGS,
        description="One log per run: bf16 and fp8, several seeds, several N, in one experiment.",
    )


class ImportRead(ExperimentRead):
    runs: list[RunBrief]
