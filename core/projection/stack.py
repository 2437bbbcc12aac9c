"""Which stack's data-parallel traffic the projection charges a series, and the words it says so in.

A series is charged, in order: the request's `stack` (every series), the experiment's `stacks` entry for the
series' engine, or the scalebench runner's stack (FSDP2 as TorchTitan applies it). The fields are
core.contracts.stacks'; a series of another engine charged the runner's stack says so in its notes.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.contracts.stacks import RUNNER_ENGINES, StackValue, format_stack, parse_stack

RUNNER_NAME = "the scalebench runner's (FSDP2 as TorchTitan applies it)"
RUNNER_STACK = (
    f"{RUNNER_NAME}: fp32 gradient reduction, one collective per block, blocks gathered again for the backward "
    "without pp and kept gathered with it, reductions after the last micro-batch under pp, micro-batches of one "
    "sequence, one virtual stage"
)


def series_stack(
    engine: str, asked: Mapping[str, StackValue] | None, stacks: Mapping[str, str] | None
) -> dict[str, StackValue]:
    """The stack a series of `engine` is charged: the request's, else the experiment's for that engine, else {}
    (the runner's). `stacks` is a stored spec's (engine -> 'field=value,...'), read again: one this version cannot
    read (stored by another) counts as none, and the series' note then says it was not charged."""
    if asked:
        return dict(asked)
    raw = stacks.get(engine) if isinstance(stacks, Mapping) else None
    try:  # JSON of another version may hold anything: only text is a stack this version reads
        return parse_stack(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}


def _lines(asked: Mapping[str, StackValue] | None, stacks: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """(summary, the rest) of each stack charged: the request's for every series, or the experiment's per engine
    and the runner's for the other series; the assumption line is the two together."""
    given = f"; fields not given: {RUNNER_STACK}"
    if asked:
        return [(f"stack of every series: as the request describes it, {_fields(asked)}", given)]
    read = {engine: series_stack(engine, None, stacks) for engine in (stacks if isinstance(stacks, Mapping) else {})}
    lines = [
        (f"stack of {engine} series: as the experiment's stacks describe it, {_fields(stack)}", given)
        for engine, stack in read.items()
        if stack
    ]
    whom = "the other series" if lines else "every series"
    rest = RUNNER_STACK.removeprefix(RUNNER_NAME) + (
        "; a series of another engine is projected so unless the request's `stack` or the experiment's `stacks` "
        "describes its stack"
    )
    return [*lines, (f"stack of {whom}: {RUNNER_NAME}", rest)]


def describe_stacks(asked: Mapping[str, StackValue] | None, stacks: Mapping[str, str] | None) -> list[str]:
    """The assumption lines a projection lists for the stacks it charged."""
    return [summary + rest for summary, rest in _lines(asked, stacks)]


def stack_summaries(asked: Mapping[str, StackValue] | None, stacks: Mapping[str, str] | None) -> list[str]:
    """One line per stack charged, without its details: what the dashboard, `scalebench show` and `plan` print."""
    return [summary for summary, _ in _lines(asked, stacks)]


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
