"""Property-based: core.projection (step_model, model, plan) is total over the whole finite range.

Every function gets any finite input (subnormals, 1e-160, 1e155 and 1e308 included; any device count the API
accepts) and answers without raising: a step is modelled (inf where a huge compute overflows, never nan), a
series is projected or refused with the reason in its notes, every projected point's numbers are finite with its
80% interval around it, a plan's options have finite times and GPU-hours (an option that would not is left out
with a note), and the JSON of every answer is strict (no Infinity or NaN).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.analysis.scaling import RunPoint, build_report
from core.contracts.stacks import DP_OVERLAP
from core.projection.model import (
    INTERVAL_VALIDATED_DOUBLINGS,
    NetworkUsed,
    interval_half_width,
    project_report,
    projected_efficiency,
)
from core.projection.network import Network
from core.projection.plan import build_plan, parse_token_count, plan_counts
from core.projection.step_model import Workload, expected_max_exponential, expected_max_normal, solve_compute, step_time

H100 = Network(platform="h100-hgx", nic="ib-400g")
MAX_N = 1 << 20  # the API's largest device count (api.schemas.projection.MAX_NUM_DEVICES)
FAST = settings(max_examples=40, deadline=None)

finite_nonneg = st.floats(
    min_value=0.0, max_value=1.7976931348623157e308, allow_nan=False, allow_infinity=False, allow_subnormal=True
)
finite_pos = st.floats(
    min_value=5e-324, max_value=1.7976931348623157e308, allow_nan=False, allow_infinity=False, allow_subnormal=True
)
counts = st.integers(min_value=1, max_value=MAX_N)
layouts = st.sampled_from(
    ["fsdp", "ddp", "hsdp:shard=8", "tp=2+fsdp", "tp=8+fsdp", "tp=2", "pp=2+fsdp", "cp=2+tp=2+fsdp", "pp=4+cp=2+ddp"]
)
EXTREMES = [5e-324, 2.2e-308, 1e-160, 1.0, 1e155, 1e300, 1e308]


def workload(
    layout: str = "fsdp",
    precision: str = "bf16",
    num_layers: int = 4,
    scaling: str = "weak",
    gbs: int | None = None,
    **stack,
) -> Workload:
    return Workload(
        model="8b",
        num_layers=num_layers,
        precision=precision,
        layout=layout,
        scaling=scaling,
        seq_len=2048,
        local_batch_size=stack.pop("local_batch_size", 2),
        global_batch_size=gbs,
        fp8_all_gather=True,
        **stack,
    )


def strict_json(model) -> dict:
    def refuse(token: str) -> float:
        raise AssertionError(f"non-strict JSON constant {token}")

    return json.loads(model.model_dump_json(), parse_constant=refuse)


def used() -> NetworkUsed:
    return NetworkUsed(
        cluster="t",
        source="test",
        gpus_per_node=8,
        max_devices=None,
        inter_node_gb_per_s=H100.inter_node_gb_per_s,
        network=H100,
    )


def runs(xs: dict[int, float], layout: str = "fsdp", precision: str = "bf16", scaling: str = "weak") -> list[RunPoint]:
    return [
        RunPoint(
            run_id=f"{layout}-{precision}-{n}",
            model="8b",
            num_layers=4,
            precision=precision,
            layout=layout,
            scaling=scaling,
            cluster="t",
            num_devices=n,
            status="succeeded",
            tokens_per_sec=x,
        )
        for n, x in xs.items()
    ]


# ---------------------------------------------------------------------------------------------- step model


@FAST
@given(
    compute=finite_nonneg,
    optimizer=finite_nonneg,
    idle=finite_nonneg,
    n=counts,
    layout=layouts,
    layers=st.integers(1, 130),
    stack=st.fixed_dictionaries(
        {
            "local_batch_size": st.sampled_from([1, 2, 3, 64]),
            "virtual_stages": st.sampled_from([1, 2, 5]),
            "dp_overlap": st.sampled_from([None, *DP_OVERLAP]),
            "micro_batch_size": st.sampled_from([None, 0, 1, 2]),
            "dp_buckets": st.sampled_from(["per-block", "megatron"]),
        }
    ),
)
@example(compute=1e308, optimizer=1e308, idle=1e308, n=8, layout="fsdp", layers=2, stack={})
@example(compute=5e-324, optimizer=0.0, idle=0.0, n=1, layout="ddp", layers=1, stack={})
@example(
    compute=1e308,
    optimizer=0.0,
    idle=0.0,
    n=64,
    layout="pp=2+fsdp",
    layers=130,
    stack={"local_batch_size": 64, "virtual_stages": 5, "dp_overlap": "overlapped"},
)
def test_step_time_is_total_and_never_nan(compute, optimizer, idle, n, layout, layers, stack):
    # the runner's stack, and the stack fields a request may set (interleaved pipelines' windows included)
    w = workload(layout, num_layers=layers, **stack)
    try:
        w.degrees(n)
    except ValueError:
        return  # a layout that cannot run at n: project_series leaves such N out with a note
    p = step_time(w, H100, n, 8, compute, optimizer_ms=optimizer, idle_ms=idle)
    values = [v for v in vars(p).values() if isinstance(v, float)]
    assert not any(math.isnan(v) for v in values)
    assert p.step_ms >= compute * (1 - 1e-9) and p.step_ms >= p.exposed_communication_ms >= 0
    assert p.step_ms >= optimizer and p.step_ms >= idle


@FAST
@given(target=finite_nonneg, slope=st.floats(1.0, 10.0), offset=st.floats(0.0, 1e6))
@example(target=1e308, slope=10.0, offset=0.0)
@example(target=5e-324, slope=1.0, offset=1.0)
def test_solve_compute_returns_a_compute_within_the_target(target, slope, offset):
    c = solve_compute(target, lambda x: offset + slope * x)
    assert 0.0 <= c <= target


@FAST
@given(n=counts, n0=counts)
def test_order_statistic_and_interval_are_finite_and_grow(n, n0):
    assert 0.0 <= expected_max_normal(n) < 6
    assert expected_max_normal(n) <= expected_max_normal(min(n + 1, MAX_N)) + 1e-12
    assert 0.0 <= expected_max_exponential(n) < 14  # H_(2^20) - 1 = 13.5
    assert expected_max_exponential(n) <= expected_max_exponential(min(n + 1, MAX_N)) + 1e-12
    h = interval_half_width(n, n0)
    assert math.isfinite(h) and h >= 0 and (h == 0) == (n == n0)
    assert interval_half_width(2 * n, n) >= interval_half_width(n + 1, n) > 0 or n == 1
    far = 2 ** (math.ceil(INTERVAL_VALIDATED_DOUBLINGS) + 1)  # past the validated span: wider as it goes
    assert interval_half_width(far * 2 * n0, n0) > interval_half_width(far * n0, n0)


def test_strong_scaling_without_a_global_batch_is_a_value_error():
    with pytest.raises(ValueError, match="global_batch_size"):
        workload(scaling="strong").tokens_per_step(8)


# ---------------------------------------------------------------------------------------------- projection


def _check_projection(report) -> None:
    body = strict_json(report)
    for s in report.series:
        if not s.points:
            assert s.notes, "a series without points says why"
        for p in s.points:
            nums = [
                p.tokens_per_sec,
                p.efficiency,
                p.step_ms,
                p.efficiency_low,
                p.efficiency_high,
                p.tokens_per_sec_low,
                p.tokens_per_sec_high,
            ]
            assert all(v is not None and math.isfinite(v) for v in nums), p
            assert p.efficiency_low <= p.efficiency <= p.efficiency_high
            assert p.tokens_per_sec_low <= p.tokens_per_sec <= p.tokens_per_sec_high
    assert len(body["series"]) == len(report.series)


@FAST
@given(
    x0=finite_pos,
    ratio1=st.floats(1e-6, 1e6),
    ratio2=st.floats(1e-6, 1e6),
    calibrate=st.booleans(),
    layout=st.sampled_from(["fsdp", "ddp", "hsdp:shard=8", "tp=2+fsdp"]),
    asked=st.lists(counts, min_size=1, max_size=4),
)
def test_project_report_is_total(x0, ratio1, ratio2, calibrate, layout, asked):
    xs = {8: x0, 16: x0 * ratio1, 64: x0 * ratio2}
    xs = {n: x for n, x in xs.items() if math.isfinite(x) and x > 0}
    report = build_report(runs(xs, layout))
    _check_projection(
        project_report(report, {"seq_len": 2048, "local_batch_size": 2}, used(), asked, calibrate=calibrate)
    )


@pytest.mark.parametrize("x", EXTREMES)
@pytest.mark.parametrize("calibrate", [False, True])
def test_extreme_throughputs_project_or_refuse_with_a_reason(x, calibrate):
    """1e155 and 1e-160 tokens/s at three N (the values of the 500s) answer; subnormals refuse with a reason."""
    report = build_report(runs({8: x, 16: x * 0.95 * 2, 64: x * 0.9 * 8}))
    out = project_report(report, {"seq_len": 2048, "local_batch_size": 2}, used(), [8, 64, 1024], calibrate=calibrate)
    _check_projection(out)
    s = out.series[0]
    if x < 1e-300:
        assert s.points == [] and s.notes and "not projected" in s.notes[0]
    elif x <= 1e300:
        assert s.points


def test_strong_series_without_global_batch_is_refused_not_raised():
    report = build_report(runs({8: 1000.0, 16: 1900.0}, scaling="strong"))
    (s,) = project_report(report, {"seq_len": 2048}, used(), [32]).series
    assert s.points == [] and "global_batch_size" in s.notes[0]


@FAST
@given(x0=finite_pos, n0=st.sampled_from([1, 8, 32]), n=counts)
def test_projected_efficiency_is_finite_or_absent(x0, n0, n):
    w = workload()
    step0 = w.tokens_per_step(n0) / x0 * 1e3
    if not math.isfinite(step0):
        return  # project_series refuses these with a reason (test above)
    eff = projected_efficiency(w, H100, 8, n0, x0, [n])
    assert all(math.isfinite(v) and v >= 0 for v in eff.values())


# ---------------------------------------------------------------------------------------------------- plan


@FAST
@given(
    x0=finite_pos,
    tokens=st.floats(1e-300, 9.99e17),
    cost=st.one_of(st.none(), st.floats(0.0, 1e6)),
    max_gpus=st.integers(1, MAX_N),
    min_eff=st.floats(1e-6, 1.0),
)
@example(x0=1e-160, tokens=9.99e17, cost=1e6, max_gpus=1024, min_eff=0.9)
@example(x0=1e155, tokens=1e-300, cost=0.0, max_gpus=MAX_N, min_eff=1.0)
@example(x0=5e-324, tokens=1e12, cost=2.0, max_gpus=64, min_eff=0.9)
def test_build_plan_is_total(x0, tokens, cost, max_gpus, min_eff):
    xs = {n: x for n, x in {8: x0, 128: x0 * 15}.items() if math.isfinite(x)}
    report = build_report(runs(xs))
    measured = [p.num_devices for s in report.series for p in s.points if p.tokens_per_sec]
    gpu_counts = plan_counts(measured, max_gpus)
    projected = project_report(report, {"seq_len": 2048, "local_batch_size": 2}, used(), gpu_counts)
    plan = build_plan(report, projected, tokens=tokens, max_gpus=max_gpus, min_efficiency=min_eff, gpu_hour_cost=cost)
    strict_json(plan)
    for row in plan.rows:
        for o in row.options:
            assert math.isfinite(o.time_to_train_hours) and math.isfinite(o.gpu_hours) and o.num_devices <= max_gpus
            if o.time_to_train_hours_low is not None and o.time_to_train_hours_high is not None:
                assert o.time_to_train_hours_low <= o.time_to_train_hours <= o.time_to_train_hours_high
                assert o.gpu_hours_low <= o.gpu_hours <= o.gpu_hours_high


@FAST
@given(measured=st.lists(counts, max_size=6), max_gpus=counts)
def test_plan_counts_double_up_to_the_cap(measured, max_gpus):
    out = plan_counts(measured, max_gpus)
    if not measured:
        assert out == []
        return
    assert out == sorted(set(out)) and all(1 <= n <= max_gpus for n in out)
    within = {n for n in measured if n <= max_gpus}
    assert within <= set(out)
    # the doubling chain of the smallest measured N, written out here: n0, 2 n0, 4 n0, ... while <= the cap
    n0 = min(measured)
    chain = [n0 * 2**k for k in range(64) if n0 * 2**k <= max_gpus]
    assert set(chain) <= set(out)
    assert set(out) == within | set(chain)  # nothing else
    if chain:
        assert chain[-1] * 2 > max_gpus  # doubled all the way up to the cap


def test_plan_counts_double_from_the_smallest_measured_count():
    assert plan_counts([3, 8], 40) == [3, 6, 8, 12, 24]
    assert plan_counts([8, 1], 8) == [1, 2, 4, 8]
    assert plan_counts([16], 8) == []
    assert plan_counts([], 1024) == []


@FAST
@given(text=st.text(max_size=30))
@example(text="1e308")
@example(text="5e-324")
def test_parse_token_count_answers_a_count_or_a_value_error(text):
    try:
        value = parse_token_count(text)
    except ValueError as exc:
        assert "allowed" in str(exc)
    else:
        assert 0 < value < 1e18


@FAST
@given(value=st.floats(1e-300, 9.99e17))
def test_parse_token_count_reads_back_any_number_it_accepts(value):
    assert parse_token_count(repr(value)) == value
