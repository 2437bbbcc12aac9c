"""Which stack's data-parallel traffic the projection charges a series, and the words it says so in.

A series is charged, in order: the request's `stack` (every series), the experiment's `stacks` entry for the
series' engine, or the scalebench runner's stack (FSDP2 as TorchTitan applies it). The fields are
core.contracts.stacks'; a series of another engine charged the runner's stack says so in its notes.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.contracts.stacks import RUNNER_ENGINES, StackValue, check_stack, format_stack, parse_stack

RUNNER_STACK = (
    "the scalebench runner's (FSDP2 as TorchTitan applies it): fp32 gradient reduction, one collective per block, "
    "blocks gathered again for the backward without pp and kept gathered with it, reductions after the last "
    "micro-batch under pp, micro-batches of one sequence, one virtual stage"
)


def series_stack(
    engine: str, asked: Mapping[str, StackValue] | None, stacks: Mapping[str, object] | None
) -> dict[str, StackValue]:
    """The stack a series of `engine` is charged: the request's, else the experiment's for that engine, else {}
    (the runner's). `stacks` is a stored spec's (engine -> 'field=value,...' or a mapping), checked again: one this
    version cannot read (stored by another) counts as none, and the series' note then says it was not charged."""
    if asked:
        return dict(asked)
    given = (stacks or {}).get(engine)
    try:
        if isinstance(given, str):
            return parse_stack(given)
        return check_stack(given) if isinstance(given, Mapping) else {}
    except ValueError:
        return {}


def describe_stacks(asked: Mapping[str, StackValue] | None, stacks: Mapping[str, object] | None) -> list[str]:
    """The assumption lines a projection lists for the stacks it charged."""
    if asked:
        return [
            f"stack of every series: as the request describes it, {_fields(asked)}; fields not given: {RUNNER_STACK}"
        ]
    read = {engine: series_stack(engine, None, stacks) for engine in (stacks or {})}
    lines = [
        f"stack of {engine} series: as the experiment's stacks describe it, {_fields(stack)}; fields not given: "
        + RUNNER_STACK
        for engine, stack in read.items()
        if stack
    ]
    other = "of the other series" if lines else "of every series"
    return [
        *lines,
        f"stack {other}: {RUNNER_STACK}; a series of another engine is projected so unless the request's `stack` "
        "or the experiment's `stacks` describes its stack",
    ]


def _fields(stack: Mapping[str, StackValue]) -> str:
    note = " (distributed_optimizer applies to ddp layouts only)" if stack.get("distributed_optimizer") is True else ""
    return format_stack(stack).replace(",", ", ") + note


def stack_note(engine: str, stack: Mapping[str, StackValue]) -> str | None:
    """A series' note where its engine's collectives may not be the ones charged: another stack, none described."""
    if stack or engine in RUNNER_ENGINES:
        return None
    return (
        f"measured on {engine}, projected with the scalebench runner's collectives: describe its stack (the "
        "request's `stack`, or the experiment's `stacks`) to project it as it runs"
    )
