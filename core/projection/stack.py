"""A training stack's data-parallel traffic and schedule, as the projection takes it from a request (`stack` of
GET /experiments/{id}/projection and /plan, `scalebench plan --stack`).

The projection charges a measured series the collectives of the stack that ran it. Without a description that is
the scalebench runner's (FSDP2 as TorchTitan applies it: fp32 gradient reduction, one collective per block, blocks
gathered again for the backward without pp and kept gathered with it, reductions after the last micro-batch under
pp, one micro-batch of one sequence). A series measured on another stack (an imported one, a `command:<name>`
engine) is projected as that stack runs only when its description says so: these are the fields the published
results in bench/published state for theirs, with the same meaning (core.projection.step_model.Workload).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.projection.step_model import DP_OVERLAP

# field -> (allowed values as the request spells them, what it sets)
STACK_FIELDS: dict[str, tuple[tuple[str, ...] | None, str]] = {
    "dp_overlap": (
        tuple(DP_OVERLAP),
        "when the data-parallel collectives run: " + "; ".join(f"{k}: {v}" for k, v in DP_OVERLAP.items()),
    ),
    "reshard_after_forward": (
        ("true", "false"),
        "FSDP gathers each block again for its backward (true: FSDP2 without pp) or keeps it gathered from "
        "forward to backward (false: ZeRO-1/2, a distributed optimizer, the runner's pipeline stages)",
    ),
    "distributed_optimizer": (
        ("true", "false"),
        "on a ddp layout, Megatron's distributed optimizer: a reduce-scatter of the gradients and an all-gather "
        "of the parameters a step instead of an all-reduce of the gradients",
    ),
    "grad_reduce_bytes": (("2", "4"), "bytes per gradient element reduced: 4 (fp32) or 2 (bf16)"),
    "dp_buckets": (
        ("per-block", "megatron"),
        "data-parallel collectives: one per transformer block (FSDP2), or Megatron-Core's buckets of max(40M, "
        "1M x DP x CP) parameters",
    ),
    "micro_batch_size": (
        None,
        "sequences per micro-batch: a pipeline's, or without pp a gradient accumulation's (1 to 4096)",
    ),
    "virtual_stages": (None, "model chunks per pipeline stage, interleaved 1F1B (1 to 64)"),
}
MAX_COUNT = {"micro_batch_size": 4096, "virtual_stages": 64}
STACK_FORM = "comma-separated field=value pairs, e.g. dp_overlap=none,grad_reduce_bytes=2; fields: " + "; ".join(
    f"{k} ({'|'.join(v) if v else '1..' + str(MAX_COUNT[k])})" for k, (v, _) in STACK_FIELDS.items()
)
RUNNER_STACK = (
    "the scalebench runner's (FSDP2 as TorchTitan applies it): fp32 gradient reduction, one collective per block, "
    "blocks gathered again for the backward without pp and kept gathered with it, reductions after the last "
    "micro-batch under pp, micro-batches of one sequence, one virtual stage"
)
# engines whose collectives are the runner's (TorchTitan applies FSDP2 with the same rules)
RUNNER_LIKE_ENGINES = ("scalebench", "torchtitan")

StackValue = str | bool | int


def parse_stack(raw: str | None) -> dict[str, StackValue]:
    """'dp_overlap=none,grad_reduce_bytes=2' -> {'dp_overlap': 'none', 'grad_reduce_bytes': 2}; None or '' -> {}.
    A ValueError names the field and its allowed values (or the form, for a pair without '=' or a repeated field)."""
    out: dict[str, StackValue] = {}
    for part in (p.strip() for p in (raw or "").split(",")):
        if not part:
            continue
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not value:
            raise ValueError(f"{part!r} is not a field=value pair; {STACK_FORM}")
        if name not in STACK_FIELDS:
            raise ValueError(f"{name!r} is not a stack field; fields: {', '.join(STACK_FIELDS)}")
        if name in out:
            raise ValueError(f"{name} given twice")
        out[name] = _value(name, value.lower())
    return out


def _value(name: str, value: str) -> StackValue:
    allowed, _ = STACK_FIELDS[name]
    if allowed is None:
        top = MAX_COUNT[name]
        if not value.isdigit() or not 1 <= int(value) <= top:
            raise ValueError(f"{name}: {value!r} is not a whole number from 1 to {top}")
        return int(value)
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    if allowed == ("true", "false"):
        return value == "true"
    return int(value) if name == "grad_reduce_bytes" else value


def describe_stack(stack: Mapping[str, StackValue]) -> str:
    """The assumption line a projection lists for the stack it charged."""
    if not stack:
        return f"stack: {RUNNER_STACK}; a series of another stack is projected so unless `stack` describes it"
    given = ", ".join(f"{k}={str(v).lower()}" for k, v in stack.items())
    note = " (distributed_optimizer applies to ddp layouts only)" if stack.get("distributed_optimizer") is True else ""
    return f"stack: as described, {given}{note}; fields not given: {RUNNER_STACK}"


def stack_note(engine: str, stack: Mapping[str, StackValue]) -> str | None:
    """A series' note where its engine's collectives may not be the ones charged: another stack, none described."""
    if stack or engine in RUNNER_LIKE_ENGINES:
        return None
    return (
        f"measured on {engine}, projected with the scalebench runner's collectives: describe its stack (the "
        "`stack` parameter: dp_overlap, grad_reduce_bytes, ...) to project it as it runs"
    )
