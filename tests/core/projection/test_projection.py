"""core.projection (network, step_model, model, plan): the collective model, the step model in its limits,
a published weak-scaling table projected from its first point, calibration and the plan. Milliseconds each.

The published table (torchtitan docs/performance.md, the version of 2024-12; tests/api/test_import.py quotes it):
Llama 3.1 8B, 1D FSDP, H100 (Grand Teton hosts, 8 GPUs and 400 Gbit/s per GPU across nodes), seq 8192,
local batch 2, activation checkpointing, tokens/s per GPU at 8 -> 128 GPUs: eager 5,762 -> 5,605, compile
6,667 -> 6,514, compile + Float8 (tensorwise, fp8 all-gather) 8,532 -> 8,380, i.e. E(128) = 97.28 / 97.71 /
98.22%. The model's constants come from datasheets, NCCL's tuning model and a fit to 26 published series of
10 sources, of which this table is one (bench/published/, bench/projection_validation.py).
"""

import math
import statistics

import pytest

from core.analysis.scaling import RunPoint, build_report
from core.catalog.shapes import SHAPES
from core.contracts.clusters import load_clusters
from core.projection.constants import (
    COLLECTIVE_UNITS,
    INTERVAL_FAMILY_COVERAGE,
    STRAGGLER_TAIL,
    VALIDATED_MAX_DEVICES,
)
from core.projection.model import (
    INTERVAL_EXPONENT,
    INTERVAL_Q_PP,
    INTERVAL_VALIDATED_DOUBLINGS,
    NetworkUsed,
    calibrated_efficiency,
    layout_family,
    project_report,
    project_series,
    projected_efficiency,
    spans_nodes,
)
from core.projection.network import (
    INTER_NODE_EFFICIENCY,
    INTRA_NODE_EFFICIENCY,
    Group,
    Network,
    all_gather,
    all_reduce,
    bus_bandwidth,
    default_network,
)
from core.projection.plan import build_plan, parse_token_count, plan_counts
from core.projection.step_model import (
    Workload,
    collectives,
    expected_max_exponential,
    expected_max_normal,
    solve_compute,
    step_time,
    unit_bytes,
)

H100 = Network(platform="h100-hgx", nic="ib-400g")
TORCHTITAN = {
    "eager": ("bf16", 5762, 5605, 97.28),
    "compile": ("bf16", 6667, 6514, 97.71),
    "float8": ("fp8-tensorwise", 8532, 8380, 98.22),
}
SPEC = {"seq_len": 8192, "local_batch_size": 2, "activation_checkpointing": "full", "fp8_all_gather": True}
_ids = iter(range(10**9))


def workload(precision="bf16", layout="fsdp", **kw) -> Workload:
    base = dict(
        model="8b",
        num_layers=32,
        precision=precision,
        layout=layout,
        seq_len=8192,
        local_batch_size=2,
        fp8_all_gather=precision == "fp8-tensorwise",
        activation_checkpointing="full",
    )
    return Workload(**(base | kw))


def used(net: Network = H100, gpus_per_node: int = 8) -> NetworkUsed:
    return NetworkUsed(
        cluster="t",
        source="test",
        gpus_per_node=gpus_per_node,
        max_devices=None,
        inter_node_gb_per_s=net.inter_node_gb_per_s,
        network=net,
    )


def runs(points: dict[int, float], precision="bf16", layout="fsdp", model="8b", layers=32) -> list[RunPoint]:
    return [
        RunPoint(
            run_id=next(_ids),
            model=model,
            num_layers=layers,
            precision=precision,
            layout=layout,
            scaling="weak",
            cluster="t",
            num_devices=n,
            status="succeeded",
            tokens_per_sec=x * n,
        )
        for n, x in points.items()
    ]  # x: tokens/s per device


def projected(rs, counts, net=H100, spec=SPEC, **kw):
    return project_report(build_report(rs), spec, used(net), counts, **kw)


def pts(report, precision="bf16", layout="fsdp"):
    (s,) = [s for s in report.series if (s.key.precision, s.key.layout) == (precision, layout)]
    return {p.num_devices: p for p in s.points}


# ----------------------------------------------------------------------------------- network, collectives


def test_network_defaults_come_from_platform_and_nic_and_fields_override():
    assert (H100.intra_node_gb_per_s, H100.inter_node_gb_per_s) == (450.0, 50.0)
    b200 = Network(platform="b200-hgx", nic="ib-400g", inter_node_efficiency=0.6)
    assert b200.intra_node_gb_per_s == 900.0 and b200.inter_node_efficiency == 0.6
    assert Network(platform="mi355x-platform", nic="roce-400g").intra_node_gb_per_s == pytest.approx(7 * 153.6 / 2)
    with pytest.raises(ValueError, match="allowed: h100-hgx, h200-hgx, b200-hgx"):
        Network(platform="h900", nic="ib-400g")
    with pytest.raises(ValueError, match="intra_node_gb_per_s"):
        Network(nic="ib-400g")
    assert default_network("AMD Instinct MI325X")[0].intra_node_gb_per_s == 448.0
    assert default_network("AMD Instinct MI350X")[0] == default_network("AMD Instinct MI355X")[0]
    assert default_network("cpu (gloo ranks)")[0] is None


def test_clusters_files_with_and_without_networks_load(tmp_path):
    clusters = load_clusters("examples/clusters.toml")
    assert clusters["h100-hgx-ib"].network.platform == "h100-hgx" and clusters["local-cpu"].network is None
    plain = tmp_path / "c.toml"
    plain.write_text('[[cluster]]\nname = "g"\nvendor = "nvidia"\ndevice_name = "NVIDIA H200"\ngpus_per_node = 8\n')
    assert load_clusters(plain)["g"].network is None


def test_ring_all_gather_is_alpha_plus_bytes_over_bus_bandwidth():
    one_node, two_nodes = Group(8, 8), Group(16, 8)
    net = H100.model_copy(update={"intra_node_efficiency": 0.8, "inter_node_efficiency": 0.8})
    # the shipped defaults (fitted, bench/projection_validation.py)
    assert (H100.intra_node_efficiency, H100.inter_node_efficiency) == (INTRA_NODE_EFFICIENCY, INTER_NODE_EFFICIENCY)
    cost = all_gather(net, one_node, 1e9)
    assert cost.bandwidth_us == pytest.approx(1e9 * 7 / 8 / (450 * 0.8 * 1e3))
    assert cost.latency_us == pytest.approx(8.4 + 7 * 3.4)  # NCCL tuning.cc: base + steps x NVLink step
    # across nodes: the node's 8 NICs carry the ring (rail-aligned channels): 8 x 50 GB/s x 0.8 < 450 x 0.8
    assert bus_bandwidth(net, two_nodes) == (pytest.approx(320.0), "inter-node")
    assert all_gather(net, two_nodes, 1e9).latency_us == pytest.approx(8.4 + 14 * 3.4 + 1 * 14.0)
    # one GPU per node (an HSDP replica group): only that GPU's own NIC
    assert bus_bandwidth(net, Group(16, 1)) == (pytest.approx(40.0), "inter-node")
    assert all_gather(H100, Group(1, 1), 1e9).time_us == 0.0 and all_reduce(H100, Group(1, 1), 1e9).time_us == 0.0
    # all-reduce moves twice the bytes of an all-gather; a tree beats the ring's latency across many nodes
    assert all_reduce(net, Group(8, 8), 1e9).bandwidth_us == pytest.approx(2 * cost.bandwidth_us)
    assert all_reduce(H100, Group(1024, 1), 8).latency_us < 8.4 + 2 * 1023 * 14.0 / 10


# ----------------------------------------------------------------------------------------- step model limits


def test_no_communication_at_one_device():
    for layout in ("fsdp", "ddp", "hsdp:shard=1"):
        p = step_time(workload(layout=layout), H100, 1, 8, 1000.0)
        assert (p.communication_ms, p.exposed_communication_ms, p.interference_ms, p.straggler_ms) == (0, 0, 0, 0)
        assert p.step_ms == pytest.approx(1000.0)


def test_communication_hides_when_compute_per_layer_exceeds_the_collective():
    w, n = workload(), 64
    off = H100.model_copy(update={"collective_sm_fraction": 0.0})
    busy = step_time(w, off, n, 8, 5000.0)  # ~50 ms of compute per block and pass vs ~2 ms collectives
    # exposed: only the head (root + first block all-gather) and tail (last reduce-scatters), nothing per block
    c = collectives(w, off, n, 8)
    head_tail = c.ag_root + c.ag_block + c.rs_block + c.rs_root  # nothing before the first block / after the last
    assert busy.exposed_communication_ms == pytest.approx(head_tail, rel=1e-12)
    assert busy.hidden_communication_ms == pytest.approx(busy.communication_ms - head_tail, rel=1e-12)
    starved = step_time(w, off, n, 8, 20.0)  # compute far below the collectives: they show
    assert starved.exposed_communication_ms > 5 * head_tail
    assert starved.interference_ms == 0.0 and starved.step_ms > starved.communication_ms
    assert busy.interference_ms == 0.0
    # by default a running collective takes COLLECTIVE_UNITS compute units (fitted on published results) of an
    # H100's 132 SMs; a network that sets f (here 16 units) slows the compute beside hidden communication by f
    assert H100.collective_sm_fraction == pytest.approx(COLLECTIVE_UNITS / 132)
    f = 16 / 132
    shared = step_time(w, H100.model_copy(update={"collective_sm_fraction": f}), n, 8, 5000.0)
    assert shared.interference_ms > 0
    assert shared.interference_ms == pytest.approx(shared.hidden_communication_ms * f, rel=1e-9)
    assert shared.step_ms == pytest.approx(busy.step_ms + shared.interference_ms, rel=1e-9)


def test_efficiency_falls_once_inter_node_bandwidth_binds():
    x8 = 6000.0
    fast_net = H100.model_copy(update={"nic_gbit_per_s": 800.0, "device_speed_cv": 0})
    fast = pts(projected(runs({8: x8}), [8, 16, 64, 256, 1024], net=fast_net))
    slow_net = H100.model_copy(update={"nic_gbit_per_s": 25.0, "device_speed_cv": 0})
    slow = pts(projected(runs({8: x8}), [8, 16, 64, 256, 1024], net=slow_net))
    # with 800G per GPU a node's 8 NICs (800 GB/s x INTER_NODE_EFFICIENCY) outrun NVLink's achieved
    # 450 x INTRA_NODE_EFFICIENCY: NVLink still binds
    assert 450 * INTRA_NODE_EFFICIENCY < 800 * INTER_NODE_EFFICIENCY
    assert fast[8].dp_bound == fast[16].dp_bound == "intra-node" and slow[16].dp_bound == "inter-node"
    effs = [slow[n].efficiency for n in (8, 16, 64, 256, 1024)]
    assert effs == sorted(effs, reverse=True) and effs[0] == pytest.approx(1.0)
    assert slow[16].efficiency < fast[16].efficiency - 0.05  # 25 Gbit/s NICs cannot hide the traffic
    assert slow[16].exposed_communication_ms > 10 * fast[16].exposed_communication_ms


def test_fp8_all_gather_halves_the_all_gather_bytes():
    bf16, fp8 = (
        unit_bytes(workload("fp8-tensorwise", fp8_all_gather=False), 64),
        unit_bytes(workload("fp8-tensorwise"), 64),
    )
    assert fp8.block_gather / bf16.block_gather == pytest.approx(0.5, abs=1e-3)  # the norms stay bf16
    assert fp8.root_gather == bf16.root_gather and fp8.block_grad == bf16.block_grad  # output and fp32 grads
    rowwise = unit_bytes(workload("fp8-rowwise", fp8_all_gather=False), 64)
    assert rowwise.block_gather == bf16.block_gather  # fp8 all-gather is tensorwise only


def test_a_distributed_optimizer_moves_its_reduce_scatter_and_all_gather_not_an_fp32_all_reduce():
    plain = unit_bytes(workload(layout="ddp"), 64)
    shape = SHAPES["8b"]
    norms = 2 * shape.dim
    linear = plain.block_grad / 4 - norms  # fp32 gradients: 4 bytes a parameter, 8 on each link of an all-reduce
    # charged as one all-reduce of the mean of what its two collectives move: fp32 gradients, bf16 parameters
    dist = unit_bytes(workload(layout="ddp", distributed_optimizer=True), 64)
    assert dist.block_grad == pytest.approx((linear + norms) * (4 + 2) / 2)
    assert dist.block_grad / plain.block_grad == pytest.approx(6 / 8)
    # fp8 linear weights gathered in fp8, bf16 gradients (Megatron's grad_reduce_in_bf16): 1 + 2 bytes, norms 2 + 2
    fp8 = unit_bytes(workload("fp8-tensorwise", "ddp", distributed_optimizer=True, grad_reduce_bytes=2), 64)
    assert fp8.block_grad == pytest.approx((linear * (2 + 1) + norms * (2 + 2)) / 2)
    assert unit_bytes(workload(layout="fsdp", distributed_optimizer=True), 64) == unit_bytes(workload(), 64)


def test_straggler_term_and_solver():
    assert expected_max_normal(1) == 0 and expected_max_normal(8) == pytest.approx(1.42, abs=0.02)
    assert expected_max_normal(128) == pytest.approx(2.58, abs=0.03)  # tables of normal order statistics
    assert expected_max_exponential(1) == 0 and expected_max_exponential(8) == pytest.approx(1.7179, abs=1e-4)
    exact = sum(1 / k for k in range(2, 1001))  # H_1000 - 1; the asymptotic form past 64
    assert expected_max_exponential(1000) == pytest.approx(exact, abs=1e-8)
    assert expected_max_exponential(65) == pytest.approx(sum(1 / k for k in range(2, 66)), abs=1e-8)
    straggler = {
        tail: step_time(workload(), H100.model_copy(update={"straggler_tail": tail}), 128, 8, 1000.0)
        for tail in ("exponential", "normal")
    }
    assert H100.straggler_tail == STRAGGLER_TAIL  # the fitted default
    assert straggler["exponential"].straggler_ms == pytest.approx(
        1000 * H100.device_speed_cv * (exact_128 := sum(1 / k for k in range(2, 129))), rel=1e-6
    )
    assert straggler["normal"].straggler_ms == pytest.approx(1000 * H100.device_speed_cv * expected_max_normal(128))
    assert exact_128 > expected_max_normal(128)  # the exponential tail lies further out
    w = workload()
    c = solve_compute(2457.5, lambda x: step_time(w, H100, 8, 8, x).step_ms)
    assert step_time(w, H100, 8, 8, c).step_ms == pytest.approx(2457.5, rel=1e-9)


# ------------------------------------------------------------------------------------------- published table


@pytest.mark.parametrize("technique", TORCHTITAN)
def test_in_sample_pin_torchtitan_fsdp_efficiency_at_128_from_the_8_gpu_point(technique):
    """An in-sample pin, not a validation: this table is in the set the shipped constants are fitted on, so the
    check guards against drift of the model or its constants. The out-of-sample miss (each source left out of
    the fit) is measured by bench/projection_validation.py."""
    precision, x8, x128, published_pct = TORCHTITAN[technique]
    report = projected(runs({8: x8, 128: x128}, precision), [8, 128])
    p = pts(report, precision)
    assert p[8].efficiency == pytest.approx(1.0) and p[8].error == pytest.approx(0.0, abs=1e-9)
    # The shipped constants are fitted on four sources (bench/projection_validation.py), this table among them: it
    # misses by up to 1.6 pp in sample (2.9 pp when its source is left out of the fit); the published point lies
    # inside the 80% interval the projection reports.
    assert abs(100 * p[128].efficiency - published_pct) < 2.0, (technique, 100 * p[128].efficiency)
    assert p[128].efficiency_low <= published_pct / 100 <= p[128].efficiency_high
    assert p[128].measured_efficiency == pytest.approx(published_pct / 100, abs=1e-4)
    assert p[128].efficiency_error_pp == pytest.approx(100 * p[128].efficiency - published_pct, abs=0.01)
    # 16 nodes: the ring runs at the slower of NVLink's achieved 450 GB/s and the node's eight 400 Gb/s NICs
    bound = "intra-node" if 450 * INTRA_NODE_EFFICIENCY < 8 * 50 * INTER_NODE_EFFICIENCY else "inter-node"
    assert p[128].dp_bound == bound and p[128].status == "projected"


def test_projection_reports_speedup_strong_scaling_and_layouts():
    rs = runs({8: 6667}, "bf16") + runs({8: 8532}, "fp8-tensorwise") + runs({8: 6000}, "bf16", "tp=8")
    report = projected(rs, [8, 64])
    assert pts(report, "fp8-tensorwise")[64].fp8_speedup == pytest.approx(
        pts(report, "fp8-tensorwise")[64].tokens_per_sec / pts(report, "bf16")[64].tokens_per_sec
    )
    tp = next(s for s in report.series if s.key.layout == "tp=8")
    assert [p.num_devices for p in tp.points] == [8] and "cannot run at N=64" in tp.notes[0]
    assert tp.points[0].tp_communication_ms > 0
    strong = Workload("8b", 32, "bf16", "fsdp", scaling="strong", seq_len=8192, global_batch_size=64)
    assert strong.tokens_per_step(8) == strong.tokens_per_step(64) == 64 * 8192


def test_calibration_recovers_the_factors_that_generated_the_points():
    truth = H100.model_copy(update={"inter_node_efficiency": 0.3, "device_speed_cv": 0.03})
    made = pts(projected(runs({8: 6000.0}), [8, 32, 128, 512], net=truth))
    measured = {n: made[n].tokens_per_sec_per_device for n in (8, 32, 128, 512)}
    report = projected(runs(measured), [8, 1024], calibrate=True)
    cal = report.series[0].calibration
    assert cal.fitted and cal.num_points == 3 and cal.rms_rel_error_after < cal.rms_rel_error_before
    assert cal.rms_rel_error_after < 2e-3
    assert cal.parameters["device_speed_cv"] == pytest.approx(0.03, abs=0.005)
    assert cal.parameters["inter_node_efficiency"] == pytest.approx(0.3, abs=0.01)
    assert pts(report)[1024].tokens_per_sec == pytest.approx(
        pts(projected(runs({8: 6000.0}), [1024], net=truth))[1024].tokens_per_sec, rel=0.02
    )
    alone = projected(runs({8: 6000.0}), [64], calibrate=True).series[0].calibration
    assert not alone.fitted and "2 or more N" in alone.reason


def test_calibrated_efficiency_is_the_reports_calibrated_projection():
    truth = H100.model_copy(update={"inter_node_efficiency": 0.3, "device_speed_cv": 0.03})
    made = pts(projected(runs({8: 6000.0}), [8, 32, 128], net=truth))
    measured = {n: made[n].tokens_per_sec for n in (8, 32, 128)}  # global tokens/s
    w = workload()
    e, cal = calibrated_efficiency(w, H100, 8, measured, [8, 128, 1024])
    report = projected(runs({n: x / n for n, x in measured.items()}), [1024], calibrate=True)
    assert cal.fitted and cal.parameters == report.series[0].calibration.parameters
    assert e[8] == pytest.approx(1.0) and e[1024] == pytest.approx(pts(report)[1024].efficiency, rel=1e-9)
    # the fit follows the measured loss at 128; from N0 alone the model keeps its own defaults
    alone = projected_efficiency(w, H100, 8, 8, measured[8], [128])
    published = measured[128] / (measured[8] * 16)
    assert abs(e[128] - published) < 0.2 * abs(alone[128] - published)
    only_n0, none = calibrated_efficiency(w, H100, 8, {8: measured[8]}, [8, 1024])
    assert not none.fitted and only_n0 == projected_efficiency(w, H100, 8, 8, measured[8], [8, 1024])


def test_unset_calibrate_fits_the_series_measured_across_nodes_only():
    assert spans_nodes([8, 16], 8, 8) and spans_nodes([16, 32], 16, 8)  # N0 already spans nodes
    assert not spans_nodes([1, 2, 4, 8], 1, 8) and not spans_nodes([8], 8, 8)
    across = runs({8: 6000.0, 32: 5800.0})
    within = runs({2: 6000.0, 8: 5700.0})
    assert projected(across, [1024], calibrate=None).series[0].calibration.fitted
    assert projected(within, [1024], calibrate=None).series[0].calibration is None
    assert projected(within, [1024], calibrate=True).series[0].calibration.fitted


def test_other_layouts_reuse_the_measured_series_calibration():
    truth = H100.model_copy(update={"inter_node_efficiency": 0.3, "device_speed_cv": 0.03})
    made = pts(projected(runs({8: 6000.0}), [8, 32, 128], net=truth))
    rs = runs({n: made[n].tokens_per_sec_per_device for n in (8, 32, 128)})
    report = projected(rs, [512], calibrate=True, layouts=["pp=2+fsdp", "cp=2+fsdp"])
    measured = report.series[0].calibration
    for layout in ("pp=2+fsdp", "cp=2+fsdp"):
        (s,) = [s for s in report.series if s.key.layout == layout]
        assert s.calibration == measured  # the fit of the measured points, not a refit per layout
        alone, _ = project_series(
            build_report(rs).series[0], SPEC, H100, 8, [512], calibrate=True, layout=layout
        )  # fitted afresh, as before: the same points
        assert {p.num_devices: p.efficiency for p in s.points} == pytest.approx(
            {p.num_devices: p.efficiency for p in alone.points}, rel=1e-12
        )


# ---------------------------------------------------------------------------------------------------- plan


def test_plan_answers_fastest_and_cheapest_efficient():
    rs = runs({8: 6667, 128: 6514}, "bf16") + runs({8: 8532, 128: 8380}, "fp8-tensorwise")
    report = build_report(rs)
    counts = plan_counts([8, 128], 1024)
    assert counts == [8, 16, 32, 64, 128, 256, 512, 1024]
    plan = build_plan(
        report, project_report(report, SPEC, used(), counts), tokens=1e12, max_gpus=1024, gpu_hour_cost=2.0
    )
    row128 = next(r for r in plan.rows if r.num_devices == 128)
    assert [o.source for o in row128.options] == ["measured", "measured"] and row128.best.precision.startswith("fp8")
    assert row128.best.time_to_train_hours == pytest.approx(1e12 / (8380 * 128) / 3600)
    assert row128.best.cost == pytest.approx(2.0 * row128.best.gpu_hours)
    assert plan.fastest.num_devices == 1024 and plan.fastest.source == "projected"
    assert plan.cheapest_efficient.num_devices == 8 and plan.cheapest_efficient.precision == "fp8-tensorwise"
    strict = build_plan(
        report, project_report(report, SPEC, used(), counts), tokens=1e12, max_gpus=1024, min_efficiency=0.999
    )
    assert all(o.num_devices == 8 for o in (strict.cheapest_efficient, strict.fastest_efficient))
    assert (
        plan_counts([16], 8) == []
        and build_plan(report, project_report(report, SPEC, used(), []), tokens=1, max_gpus=4).notes
    )


def test_token_counts_parse_with_suffixes():
    assert [parse_token_count(t) for t in ("1T", "500B", "1e12", "2.5e11", "15k")] == [1e12, 5e11, 1e12, 2.5e11, 15e3]
    for bad in ("", "lots", "-1T", "inf", "nan", "1e30"):
        with pytest.raises(ValueError, match="allowed"):
            parse_token_count(bad)
    assert math.isclose(parse_token_count("1,000,000"), 1e6)


def test_calibration_leaves_the_network_alone_when_no_point_crosses_nodes():
    measured = {1: 7000.0, 2: 6900.0, 4: 6800.0, 8: 6700.0}
    cal = projected(runs(measured), [64], calibrate=True).series[0].calibration
    assert cal.fitted and set(cal.parameters) == {"device_speed_cv"} and cal.num_points == 3


# ------------------------------------------------------------------------------------------------ intervals


def test_interval_contains_the_projection_and_widens_with_n():
    counts = [8, 16, 64, 512, 2048, 4096, 32768]
    p = pts(projected(runs({8: 6000.0}), counts))
    assert p[8].efficiency_low == p[8].efficiency == p[8].efficiency_high  # N0: no doubling, no width
    widths = [p[n].efficiency_high - p[n].efficiency_low for n in counts]
    assert all(b >= a - 1e-12 for a, b in zip(widths, widths[1:])) and widths[-1] > widths[1] > 0
    for n in counts:
        q = p[n]
        assert q.efficiency_low <= q.efficiency <= q.efficiency_high
        assert q.tokens_per_sec_low <= q.tokens_per_sec <= q.tokens_per_sec_high
        d, span = math.log2(n / 8), INTERVAL_VALIDATED_DOUBLINGS
        # q x d ** p within the validated span of doublings, then widening as sqrt(d / span)
        scale = d**INTERVAL_EXPONENT if d <= span else span**INTERVAL_EXPONENT * math.sqrt(d / span)
        assert q.efficiency_high - q.efficiency == pytest.approx(INTERVAL_Q_PP / 100 * scale if n > 8 else 0.0)
    assert VALIDATED_MAX_DEVICES == 16384  # Llama 3's 16,384-GPU point is the largest published N
    assert not p[4096].beyond_validated and p[32768].beyond_validated
    assert p[16].note is None and "beyond the largest validated N (16384)" in p[32768].note
    for n in counts:  # past the validated span of doublings the note says the width is assumed
        past = math.log2(n / 8) > INTERVAL_VALIDATED_DOUBLINGS and n <= VALIDATED_MAX_DEVICES
        assert (f"more than {INTERVAL_VALIDATED_DOUBLINGS:g} doublings from N0=8" in (p[n].note or "")) is past


@pytest.mark.parametrize(
    ("layout", "family"),
    [
        ("fsdp", "fsdp"),
        ("ddp", "ddp"),
        ("hsdp:shard=8", "hsdp"),
        ("tp=2+fsdp", "tp+fsdp"),
        ("tp=4", "tp+fsdp"),
        ("cp=2+fsdp", "cp"),
        ("pp=4+cp=2+tp=2+fsdp", "pp (+tp, +cp)"),
        ("pp=1+fsdp", "fsdp"),
    ],
)
def test_a_layout_belongs_to_the_family_the_validation_reports(layout, family):
    assert layout_family(layout) == family


def test_a_projection_says_where_its_family_was_covered_less_than_the_interval_promises():
    report = projected(runs({8: 6000.0}), [8, 64, 512], layouts=["pp=2+fsdp"])
    fsdp, pp = (next(s for s in report.series if s.key.layout == t) for t in ("fsdp", "pp=2+fsdp"))
    inside, total = INTERVAL_FAMILY_COVERAGE["fsdp"]
    assert inside / total < 0.75  # the recorded validation: fsdp points fell inside less often than 80%
    (note,) = [n for n in fsdp.notes if n.startswith("80% interval")]
    assert f"{inside} of the {total} published points of the layout family fsdp" in note
    inside, total = INTERVAL_FAMILY_COVERAGE["pp (+tp, +cp)"]
    assert inside / total >= 0.75 and total >= 5
    assert not [n for n in pp.notes if n.startswith("80% interval")]
    # a plan with projected fsdp options carries the note once; one with measured options only does not
    plan = build_plan(build_report(runs({8: 6000.0})), report, tokens=1e12, max_gpus=512)
    assert [n for n in plan.notes if n.startswith("80% interval")] == [note]
    measured_only = build_plan(build_report(runs({8: 6000.0})), report, tokens=1e12, max_gpus=8)
    assert not [n for n in measured_only.notes if n.startswith("80% interval")]


def test_points_above_100_percent_from_one_device_say_why():
    """From N=1 the optimizer step runs unsharded; FSDP shards it from N=2 on, so E(N) can pass 100%."""
    rs = runs({1: 9000.0})
    report = build_report(rs)
    bd = {("bf16", "fsdp", 1): {"step_ms": 2000.0, "optimizer_ms": 200.0, "exposed_communication_ms": 0.0}}
    out = project_report(
        report, SPEC, used(H100.model_copy(update={"device_speed_cv": 0.0})), [1, 2, 4, 8], breakdowns=bd
    )
    p = pts(out)
    assert p[2].efficiency > 1.0 and "optimizer step is sharded" in p[2].note
    assert p[1].note is None


def test_plan_carries_the_interval():
    rs = runs({8: 6667, 128: 6514})
    report = build_report(rs)
    plan = build_plan(report, project_report(report, SPEC, used(), [8, 128, 1024]), tokens=1e12, max_gpus=1024)
    by_n = {r.num_devices: r.best for r in plan.rows}
    measured, projected_1024 = by_n[128], by_n[1024]
    assert measured.source == "measured" and measured.time_to_train_hours_low == measured.time_to_train_hours_high
    o = projected_1024
    assert o.source == "projected"
    assert o.time_to_train_hours_low < o.time_to_train_hours < o.time_to_train_hours_high
    assert o.gpu_hours_low < o.gpu_hours < o.gpu_hours_high
    assert o.efficiency_low < o.efficiency < o.efficiency_high


def test_plan_gives_time_and_gpu_hours_at_equal_loss():
    """fp8 that needs 1.1x the steps of bf16 to the same loss: its time at equal loss is 1.1x its time to train
    the budget (its own ratio where measured, else the median over the series' measured N); bf16's is its own."""
    from core.analysis.numerics import RunLosses

    def curve(run_id: str, stretch: float) -> RunLosses:
        losses = tuple(2.0 + 10.0 / math.sqrt(t / stretch + 10) for t in range(1200))
        return RunLosses(run_id=run_id, seed=0, steps=tuple(range(1200)), losses=losses)

    bf16, fp8 = runs({8: 6667, 128: 6514}, "bf16"), runs({8: 8532, 128: 8380}, "fp8-tensorwise")
    # fp8 curves run 1,200 steps, bf16's 1,000 (the steps fp8 needs past bf16's end are in its run)
    curves = {str(r.run_id): curve(str(r.run_id), 1.1) for r in fp8}
    for r in bf16:
        c = curve(str(r.run_id), 1.0)
        curves[str(r.run_id)] = RunLosses(run_id=c.run_id, seed=0, steps=c.steps[:1000], losses=c.losses[:1000])
    report = build_report(bf16 + fp8, run_losses=curves)
    assert all(sp.steps_ratio == pytest.approx(1.1, abs=0.02) for sp in report.speedups)
    assert all(sp.effective_speedup == pytest.approx(sp.speedup / sp.steps_ratio) for sp in report.speedups)
    plan = build_plan(report, project_report(report, SPEC, used(), [8, 128, 1024]), tokens=1e12, max_gpus=1024)
    by = {(o.precision, o.num_devices): o for row in plan.rows for o in row.options}
    o = by[("fp8-tensorwise", 128)]
    assert o.time_at_equal_loss_hours == pytest.approx(o.time_to_train_hours * o.steps_ratio)
    assert o.gpu_hours_at_equal_loss == pytest.approx(o.gpu_hours * o.steps_ratio) and o.equal_loss_note is None
    far = by[("fp8-tensorwise", 1024)]
    assert far.steps_ratio == pytest.approx(statistics.median(sp.steps_ratio for sp in report.speedups))
    assert "median of N=8, 128" in far.equal_loss_note
    b = by[("bf16", 128)]
    assert b.steps_ratio is None and b.time_at_equal_loss_hours == b.time_to_train_hours
