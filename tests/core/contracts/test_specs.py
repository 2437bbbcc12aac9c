"""ExperimentSpec / RunSpec / ParallelDegrees validation: pure, milliseconds."""

import pytest
from pydantic import ValidationError

from core.contracts.specs import ExperimentSpec, ParallelDegrees, RunResult, check_layout, resolve_layout

BASE = dict(name="e", model="debug", gpu_counts=[1, 2], precisions=["bf16"])


def test_defaults_and_normalization():
    spec = ExperimentSpec(**{**BASE, "gpu_counts": [4, 1, 2, 2], "layouts": ["FSDP", "tp=2 + fsdp", "fsdp"]})
    assert spec.gpu_counts == [1, 2, 4]
    assert spec.layouts == ["fsdp", "tp=2+fsdp"]
    assert spec.scaling == "weak" and spec.cluster == "local-cpu"


@pytest.mark.parametrize(
    "field,value",
    [
        ("unknown_field", 1),
        ("model", "7b"),
        ("precisions", ["fp4"]),
        ("gpu_counts", [0]),
        ("gpu_counts", []),
        ("layouts", ["zero3"]),
        ("scaling", "linear"),
        ("steps", 1),
    ],
)
def test_bad_fields_are_rejected_with_their_path(field, value):
    with pytest.raises(ValidationError) as info:
        ExperimentSpec(**{**BASE, field: value})
    assert field in str(info.value)


def test_layout_error_names_allowed_forms():
    with pytest.raises(ValueError, match=r"hsdp:shard=S"):
        check_layout("pp=2")


def test_cross_field_rules():
    with pytest.raises(ValidationError, match="warmup_steps"):
        ExperimentSpec(**{**BASE, "steps": 5, "warmup_steps": 5})
    with pytest.raises(ValidationError, match="global_batch_size is required"):
        ExperimentSpec(**{**BASE, "scaling": "strong"})
    with pytest.raises(ValidationError, match="precompute_fp8_scales needs fp8_all_gather"):
        ExperimentSpec(**{**BASE, "precompute_fp8_scales": True})


@pytest.mark.parametrize(
    "template,n,expected",
    [
        ("fsdp", 8, ("fsdp", 1, 8, 1)),
        ("ddp", 4, ("ddp", 4, 1, 1)),
        ("hsdp:shard=8", 32, ("hsdp", 4, 8, 1)),
        ("tp=2+fsdp", 8, ("fsdp", 1, 4, 2)),
        ("tp=8", 8, ("none", 1, 1, 8)),
    ],
)
def test_layouts_scale_with_n(template, n, expected):
    d = resolve_layout(template, n)
    assert (d.dp_mode, d.dp_replicate, d.dp_shard, d.tp) == expected
    assert d.world_size == n


@pytest.mark.parametrize(
    "template,n,reason",
    [
        ("tp=4+fsdp", 2, "does not divide"),
        ("hsdp:shard=8", 4, "does not divide"),
        ("hsdp:shard=3", 8, "does not divide"),
        ("tp=8", 16, "exactly 8"),
    ],
)
def test_impossible_points_say_why(template, n, reason):
    with pytest.raises(ValueError, match=reason):
        resolve_layout(template, n)


def test_degrees_error_names_every_factor():
    with pytest.raises(ValidationError, match=r"dp_replicate\(1\) \* dp_shard\(2\) \* tp\(3\) != world size\(4\)"):
        ParallelDegrees(dp_mode="fsdp", dp_replicate=1, dp_shard=2, tp=3, world_size=4)


def test_result_status_needs_error_or_summary():
    with pytest.raises(ValidationError, match="needs an error"):
        RunResult(run_key="k", status="failed")
    ok = RunResult(run_key="k", status="failed", error={"kind": "oom", "message": "out of memory"})
    assert RunResult.model_validate_json(ok.model_dump_json()) == ok


def _error_on(field: str, **kw) -> str:
    with pytest.raises(ValidationError) as exc:
        ExperimentSpec(**(BASE | kw))
    errors = [e for e in exc.value.errors() if e["loc"][:1] == (field,)]
    assert errors, exc.value.errors()
    return errors[0]["msg"]


def test_warmup_steps_is_called_the_default_only_when_it_was_left_out() -> None:
    assert "(the default)" in _error_on("warmup_steps", steps=5)
    explicit = _error_on("warmup_steps", steps=5, warmup_steps=5)
    assert "(the default)" not in explicit and "warmup_steps(5) must be below steps(5)" in explicit
    assert (
        "(the default)"
        not in ExperimentSpec.model_validate_json(
            '{"name": "e", "model": "debug", "gpu_counts": [1], "precisions": ["bf16"], "steps": 6}'
        ).model_dump_json()
    )


def test_lr_warmup_steps_beyond_steps_is_refused() -> None:
    assert "lr_warmup_steps(100000) must be at most steps(6)" in _error_on(
        "lr_warmup_steps", steps=6, warmup_steps=1, lr_warmup_steps=100000
    )
    assert ExperimentSpec(**(BASE | {"steps": 6, "warmup_steps": 1, "lr_warmup_steps": 6})).lr_warmup_steps == 6


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "line\r\nInjected: yes", "tab\there", "del\x7f"])
def test_names_and_tags_are_one_line(bad: str) -> None:
    assert "control character" in _error_on("name", name=bad)
    with pytest.raises(ValidationError) as exc:
        ExperimentSpec(**(BASE | {"tags": ["ok", bad]}))
    assert [e["loc"] for e in exc.value.errors()] == [("tags", 1)]
