"""A measured stack's description (core.projection.stack): parsed with errors that name the field and the allowed
values, and charged by the projection as the published results' own descriptions are. Pure logic, milliseconds."""

import pytest

from core.analysis.scaling import RunPoint, build_report
from core.contracts.stacks import STACK_FIELDS, check_stack, format_stack, parse_stack
from core.projection.model import project_report
from core.projection.stack import describe_stacks
from tests.core.projection.test_projection_props import used

NET = used()
SPEC = {"seq_len": 8192, "local_batch_size": 4}
MEGATRON = "distributed_optimizer=true,grad_reduce_bytes=2"


def test_a_stack_parses_to_typed_values() -> None:
    assert parse_stack(None) == parse_stack("") == parse_stack(" , ") == {}
    assert parse_stack(" dp_overlap = none , reshard_after_forward=FALSE,grad_reduce_bytes=2,virtual_stages=4") == {
        "dp_overlap": "none",
        "reshard_after_forward": False,
        "grad_reduce_bytes": 2,
        "virtual_stages": 4,
    }
    assert parse_stack(MEGATRON) == {
        "distributed_optimizer": True,
        "grad_reduce_bytes": 2,
    }


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("dp_overlap=sometimes", "dp_overlap: 'sometimes' is not one of overlapped, reduce-after, none"),
        ("grad_reduce_bytes=8", "grad_reduce_bytes: '8' is not one of 2, 4"),
        ("distributed_optimizer=yes", "distributed_optimizer: 'yes' is not one of true, false"),
        ("micro_batch_size=0", "micro_batch_size: '0' is not a whole number from 1 to 4096"),
        ("virtual_stages=x", "virtual_stages: 'x' is not a whole number from 1 to 64"),
        ("micro_batch_size=²", "micro_batch_size: '²' is not a whole number from 1 to 4096"),  # str.isdigit's
        ("zero_stage=3", "'zero_stage' is not a stack field; fields: dp_overlap, reshard_after_forward"),
        ("dp_overlap", "'dp_overlap' is not a field=value pair"),
        ("dp_overlap=", "'dp_overlap=' is not a field=value pair"),
        ("dp_overlap=none,dp_overlap=overlapped", "dp_overlap given twice"),
        ("dp_bucket_params=0", "dp_bucket_params: '0' is not a whole number from 1 to 1000000000000"),
        (
            "dp_bucket_params=768000000",
            "dp_bucket_params: sets the size of Megatron-Core's buckets, so it needs dp_buckets=megatron",
        ),
        ("dp_buckets=per-block,dp_bucket_params=1", "dp_bucket_params: sets the size"),
    ],
)
def test_a_bad_stack_names_the_field_and_what_it_allows(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
        parse_stack(raw)


def _projection(engine: str, layout: str, stack: str | None = None, stacks: dict | None = None):
    points = [
        RunPoint(
            run_id=i,
            engine=engine,
            model="8b",
            num_layers=32,
            precision="bf16",
            layout=layout,
            num_devices=n,
            scaling="weak",
            cluster="c",
            status="succeeded",
            tokens_per_sec=9000.0 * n,
        )
        for i, n in enumerate((8, 16))
    ]
    spec = SPEC | {"stacks": stacks or {}}
    report = project_report(build_report(points), spec, NET, [8, 64, 512, 2048], stack=parse_stack(stack))
    (series,) = report.series
    return report, series, {p.num_devices: p for p in series.points}


def test_the_projection_charges_the_described_stack_and_says_so() -> None:
    runner_report, runner_series, runner = _projection("scalebench", "ddp")
    assert runner_report.assumptions[0].startswith("stack of every series: the scalebench runner's (FSDP2")
    assert not any("projected with the scalebench runner's collectives" in n for n in runner_series.notes)
    report, series, megatron = _projection("command:megatron", "ddp", MEGATRON)
    assert report.assumptions[0].startswith(
        "stack of every series: as the request describes it, distributed_optimizer=true, grad_reduce_bytes=2 "
        "(distributed_optimizer applies to ddp layouts only); fields not given: the scalebench runner's"
    )
    assert not any("describe its stack" in n for n in series.notes)
    # bf16 gradients through a distributed optimizer move 4 bytes a parameter where the runner's fp32
    # all-reduce moves 8 (norms move 6: a little over half in all)
    assert 0.5 < megatron[2048].communication_ms / runner[2048].communication_ms < 0.55
    assert megatron[2048].efficiency > runner[2048].efficiency
    # Megatron's buckets grow with DP (2,048M parameters at DP 2,048, nine blocks): the last one is exposed
    _, _, bucketed = _projection("command:megatron", "ddp", MEGATRON + ",dp_buckets=megatron")
    assert bucketed[2048].exposed_communication_ms > 2 * megatron[2048].exposed_communication_ms
    assert bucketed[2048].efficiency < megatron[2048].efficiency - 0.005
    # reductions after the last micro-batch and gathers after the optimizer step: every collective exposed
    _, _, exposed = _projection("command:megatron", "ddp", MEGATRON + ",dp_overlap=none")
    assert exposed[2048].exposed_communication_ms == pytest.approx(exposed[2048].communication_ms)
    assert exposed[2048].efficiency < megatron[2048].efficiency - 0.003


def test_a_series_of_another_stack_without_a_description_says_what_it_was_charged() -> None:
    _, series, _ = _projection("command:megatron", "fsdp")
    assert any(
        n.startswith("measured on command:megatron, projected with the scalebench runner's collectives")
        for n in series.notes
    )
    _, titan, _ = _projection("torchtitan", "fsdp")  # FSDP2 as the runner applies it
    assert not any("describe its stack" in n for n in titan.notes)


def test_an_experiments_stack_is_charged_to_its_engines_series_and_a_request_overrides_it() -> None:
    stored = {"command:megatron": MEGATRON + ",dp_overlap=none"}
    report, series, from_spec = _projection("command:megatron", "ddp", stacks=stored)
    _, _, asked = _projection("command:megatron", "ddp", MEGATRON + ",dp_overlap=none")
    assert from_spec[2048].efficiency == asked[2048].efficiency
    assert report.assumptions[:2] == describe_stacks(None, stored)
    assert report.assumptions[0].startswith(
        "stack of command:megatron series: as the experiment's stacks describe it, distributed_optimizer=true, "
        "grad_reduce_bytes=2, dp_overlap=none"
    )
    assert report.assumptions[1].startswith("stack of the other series: the scalebench runner's")
    assert not any("describe its stack" in n for n in series.notes)
    # the request's stack replaces the experiment's for every series
    _, _, overridden = _projection("command:megatron", "ddp", MEGATRON, stacks=stored)
    _, _, megatron = _projection("command:megatron", "ddp", MEGATRON)
    assert overridden[2048].efficiency == megatron[2048].efficiency != from_spec[2048].efficiency


def test_a_stored_stack_this_version_cannot_read_is_charged_as_none_and_said() -> None:
    report, series, unread = _projection("command:megatron", "ddp", stacks={"command:megatron": "dp_overlap=later"})
    _, _, runner = _projection("command:megatron", "ddp")
    assert unread[2048].efficiency == runner[2048].efficiency
    assert report.assumptions[0].startswith("stack of every series: the scalebench runner's")
    assert any(
        n.startswith("measured on command:megatron, projected with the scalebench runner's") for n in series.notes
    )


def test_a_stack_reads_the_same_from_json_values_and_text() -> None:
    typed = {"distributed_optimizer": True, "grad_reduce_bytes": 2, "micro_batch_size": 4, "dp_overlap": "none"}
    assert check_stack(typed) == parse_stack(format_stack(typed)) == typed
    assert format_stack(typed) == "distributed_optimizer=true,grad_reduce_bytes=2,micro_batch_size=4,dp_overlap=none"
    with pytest.raises(ValueError, match="^micro_batch_size: '1.5' is not a whole number from 1 to 4096$"):
        check_stack({"micro_batch_size": 1.5})


def test_every_field_is_described_for_the_request() -> None:
    for name, (allowed, what) in STACK_FIELDS.items():
        value = allowed[0] if allowed else "1"
        needs = "dp_buckets=megatron," if name == "dp_bucket_params" else ""
        assert what and f"{name}={value}" in describe_stacks(parse_stack(f"{needs}{name}={value}"), None)[0]


def test_a_stacks_bucket_size_replaces_megatrons_default() -> None:
    """Megatron's default at DP 64 is 64M parameters, less than one 8B block (218M): one block a bucket; a stack
    that sets 768M (NeMo's BUCKET_SIZE) sends three blocks a bucket, and its last bucket is exposed."""
    _, _, default = _projection("command:nemo", "ddp", MEGATRON + ",dp_buckets=megatron")
    _, _, large = _projection("command:nemo", "ddp", MEGATRON + ",dp_buckets=megatron,dp_bucket_params=768000000")
    assert large[64].exposed_communication_ms > 1.2 * default[64].exposed_communication_ms
    assert large[64].efficiency < default[64].efficiency
    assert large[8].efficiency == default[8].efficiency == 1.0


@pytest.mark.parametrize(
    "stored",
    [{"command:megatron": {"dp_overlap": "none"}}, {"command:megatron": 2}, ["command:megatron"], "dp_overlap=none"],
)
def test_a_stored_stack_of_another_shape_is_charged_as_none_and_said(stored) -> None:
    report, series, unread = _projection("command:megatron", "ddp", stacks=stored)
    _, _, runner = _projection("command:megatron", "ddp")
    assert unread[2048].efficiency == runner[2048].efficiency
    assert report.assumptions[0].startswith("stack of every series: the scalebench runner's")
    assert report.stacks == ["stack of every series: the scalebench runner's (FSDP2 as TorchTitan applies it)"]
    assert any(
        n.startswith("measured on command:megatron, projected with the scalebench runner's") for n in series.notes
    )
