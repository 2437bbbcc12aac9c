"""How a training stack moves and schedules its data-parallel traffic: the vocabulary the projection charges
(core.projection.step_model.Workload) and a request describes a stack in: the `stack` query of GET
/experiments/{id}/projection and /plan (`scalebench plan --stack`), and an experiment's `stacks`, one per engine
that is not the scalebench runner's. The published results in bench/published state theirs in the same fields.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

# When a step's data-parallel collectives run, over the micro-batches of a pipeline stage (Workload.dp_overlap):
DP_OVERLAP = {
    "overlapped": "gathers beside the first micro-batch's forward, reductions beside the last one's backward "
    "(FSDP2 without pp; Megatron-Core's overlap_param_gather and overlap_grad_reduce); with virtual stages, a model "
    "chunk's collectives beside another chunk's P micro-batches (Megatron-Core's interleaved 1F1B)",
    "reduce-after": "gathers so, reductions after the last backward, exposed (torch.distributed.pipelining's "
    "REDUCE_GRAD action: the runner's and TorchTitan's pp)",
    "none": "every data-parallel collective exposed (DeepSpeed's pipeline engine: gradients reduced after the last "
    "backward, ZeRO-1's parameters gathered after the optimizer step)",
}
# field -> (allowed values as a request spells them; None: a count up to MAX_COUNT), what it sets
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
    "dp_bucket_params": (
        None,
        "with dp_buckets=megatron, parameters per bucket as the stack sets them (Megatron-Core's "
        "DistributedDataParallelConfig.bucket_size, NeMo's BUCKET_SIZE) instead of its default (1 to 10^12)",
    ),
    "micro_batch_size": (
        None,
        "sequences per micro-batch: a pipeline's, or without pp a gradient accumulation's (1 to 4096)",
    ),
    "virtual_stages": (None, "model chunks per pipeline stage, interleaved 1F1B (1 to 64)"),
}
MAX_COUNT = {"micro_batch_size": 4096, "virtual_stages": 64, "dp_bucket_params": 10**12}
STACK_FORM = "comma-separated field=value pairs, e.g. dp_overlap=none,grad_reduce_bytes=2; fields: " + "; ".join(
    f"{k} ({'|'.join(v) if v else '1..' + str(MAX_COUNT[k])})" for k, (v, _) in STACK_FIELDS.items()
)
# engines that run the scalebench runner's stack (TorchTitan applies FSDP2 with the runner's rules)
RUNNER_ENGINES = ("scalebench", "torchtitan")

StackValue = str | bool | int


def parse_stack(raw: str | None) -> dict[str, StackValue]:
    """'dp_overlap=none,grad_reduce_bytes=2' -> {'dp_overlap': 'none', 'grad_reduce_bytes': 2}; None or '' -> {}.
    A ValueError names the field and its allowed values (or the form, for a pair without '=' or a repeated field)."""
    pairs: dict[str, str] = {}
    for part in (p.strip() for p in (raw or "").split(",")):
        if not part:
            continue
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not value:
            raise ValueError(f"{part!r} is not a field=value pair; {STACK_FORM}")
        if name in pairs:
            raise ValueError(f"{name} given twice")
        pairs[name] = value
    return check_stack(pairs)


def check_stack(values: Mapping[str, object]) -> dict[str, StackValue]:
    """A stack given as a mapping ({'grad_reduce_bytes': 2} or {'grad_reduce_bytes': '2'}), typed; a ValueError
    names the field and its allowed values."""
    out: dict[str, StackValue] = {}
    for name, value in values.items():
        if name not in STACK_FIELDS:
            raise ValueError(f"{name!r} is not a stack field; fields: {', '.join(STACK_FIELDS)}")
        text = str(value).lower() if isinstance(value, bool | int | str) else repr(value)
        out[name] = _value(name, text)
    if "dp_bucket_params" in out and out.get("dp_buckets") != "megatron":
        raise ValueError("dp_bucket_params: sets the size of Megatron-Core's buckets, so it needs dp_buckets=megatron")
    return out


def format_stack(stack: Mapping[str, StackValue]) -> str:
    """{'dp_overlap': 'none', 'grad_reduce_bytes': 2} -> 'dp_overlap=none,grad_reduce_bytes=2' (parse_stack's form)."""
    return ",".join(f"{k}={str(v).lower()}" for k, v in stack.items())


def _value(name: str, value: str) -> StackValue:
    allowed, _ = STACK_FIELDS[name]
    if allowed is None:
        top = MAX_COUNT[name]
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= top:
            raise ValueError(f"{name}: {value!r} is not a whole number from 1 to {top}")
        return int(value)
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    if allowed == ("true", "false"):
        return value == "true"
    return int(value) if name == "grad_reduce_bytes" else value
