"""Pipeline and context parallel layouts, NCCL's algorithm choice, rack-scale platforms, and layouts projected from
another layout's measured series. Pure logic, milliseconds each."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.scaling import RunPoint, build_report
from core.contracts.specs import check_layout, model_parallel_size, resolve_layout
from core.projection.model import NetworkUsed, project_report
from core.projection.network import Group, Network, all_gather, all_reduce, pat_latency_us, point_to_point
from core.projection.plan import build_plan, default_plan_layouts, plan_counts
from core.projection.step_model import Workload, collectives, groups, stage_factors, step_time

H100 = Network(platform="h100-hgx", nic="ib-400g")
MI325X = Network(platform="mi325x-platform", nic="pollara-400g")
_ids = iter(range(10**9))


def workload(layout: str, **kw) -> Workload:
    base = dict(model="8b", num_layers=32, precision="bf16", layout=layout, seq_len=8192, local_batch_size=8)
    return Workload(**(base | kw))


def used(net: Network, gpus_per_node: int = 8) -> NetworkUsed:
    return NetworkUsed(
        cluster="t",
        source="test",
        gpus_per_node=gpus_per_node,
        max_devices=None,
        inter_node_gb_per_s=net.inter_node_gb_per_s,
        network=net,
    )


def runs(points: dict[int, float], layout="fsdp", precision="bf16") -> list[RunPoint]:
    return [
        RunPoint(
            run_id=next(_ids),
            model="8b",
            num_layers=32,
            precision=precision,
            layout=layout,
            scaling="weak",
            cluster="t",
            num_devices=n,
            status="succeeded",
            tokens_per_sec=x * n,
        )
        for n, x in points.items()
    ]


SPEC = {"seq_len": 8192, "local_batch_size": 2, "activation_checkpointing": "full"}


# ------------------------------------------------------------------------------------------------- grammar


def test_layout_grammar_takes_pp_and_cp_before_the_data_parallel_form():
    d = resolve_layout("pp=4+tp=2+fsdp", 64)
    assert (d.pp, d.cp, d.tp, d.dp_shard, d.dp_mode, d.world_size) == (4, 1, 2, 8, "fsdp", 64)
    d = resolve_layout("cp=2+fsdp", 16)
    assert (d.pp, d.cp, d.dp_shard, d.dp_degree) == (1, 2, 8, 8)
    d = resolve_layout("pp=2+cp=2+hsdp:shard=2", 16)
    assert (d.pp, d.cp, d.dp_replicate, d.dp_shard) == (2, 2, 2, 2)
    assert check_layout(" PP=4+TP=2+FSDP ") == "pp=4+tp=2+fsdp"
    assert resolve_layout("tp=2+fsdp", 16).pp == 1  # existing layouts unchanged
    with pytest.raises(ValueError, match=r"pp\(3\) x cp\(1\) = 3 does not divide 8 devices"):
        resolve_layout("pp=3+fsdp", 8)
    with pytest.raises(ValueError, match="is not one of"):
        check_layout("cp=2+pp=2+fsdp")  # pp comes first
    with pytest.raises(ValueError, match="is not one of"):
        check_layout("pp=0+fsdp")


# ------------------------------------------------------------------------------------ NCCL's algorithm choice


def test_pat_replaces_the_ring_at_one_gpu_per_node_with_a_log_depth_latency():
    one_per_node = Group(1024, 1)
    pat = all_gather(H100, one_per_node, 64e6)
    assert pat.algorithm == "pat"
    ring_steps_us = H100.call_latency_us + 1023 * H100.inter_node_latency_us
    assert pat.latency_us == pytest.approx(pat_latency_us(H100, one_per_node)) and pat.latency_us < ring_steps_us / 4
    # 8.0 + log2(1024) x 14 / 3.5 + 1024 x 2.8 us: NCCL's tuning model for PAT
    assert pat.latency_us == pytest.approx(8.0 + 10 * 4.0 + 1024 * 2.8)
    # RCCL: no PAT assumed on AMD platforms, a ring there; several GPUs per node: a ring everywhere
    assert all_gather(MI325X, one_per_node, 64e6).algorithm == "ring"
    assert all_gather(H100, Group(1024, 8), 64e6).algorithm == "ring"
    # a large message at few nodes: the ring's full bandwidth beats PAT's 0.75 of it
    assert all_gather(H100, Group(4, 1), 8e9).algorithm == "ring"


def test_all_reduce_takes_the_tree_where_its_log_depth_latency_wins():
    big = Group(4096, 8)
    small = all_reduce(H100, big, 1e5)
    assert small.algorithm == "tree" and small.latency_us < 2 * 13 * H100.inter_node_latency_us + 200
    assert all_reduce(H100, Group(8, 8), 1e9).algorithm == "ring"


def test_gb200_nvl72_keeps_72_gpus_on_nvlink():
    gb200 = Network(platform="gb200-nvl72", nic="ib-400g")
    assert gb200.nvlink_domain_gpus == 72 and gb200.intra_node_gb_per_s == 900.0 and gb200.pat
    w = workload("fsdp")
    c_rack = collectives(w, gb200, 64, 4)  # clusters of 4-GPU compute trays: the NVLink domain still spans 72
    assert c_rack.dp_bound == "intra-node"
    c_hgx = collectives(w, Network(platform="b200-hgx", nic="ib-400g"), 64, 8)
    assert c_hgx.dp_bound == "inter-node" and c_rack.ag_block < c_hgx.ag_block


def test_amd_platforms_carry_their_nics():
    for platform in ("mi300x-platform", "mi325x-platform", "mi355x-platform"):
        net = Network(platform=platform, nic="pollara-400g")
        assert net.inter_node_gb_per_s == 50.0 and not net.pat


# --------------------------------------------------------------------------------------------- step model


def test_pipeline_stage_holds_its_layers_and_waits_out_the_bubble():
    w = workload("pp=4+tp=2+fsdp", micro_batch_size=1, virtual_stages=1)
    assert w.stage_layers(64) == 9  # the runner's split, 9/8/8/7: the last stage also runs the output layer
    assert w.bubble(64) == pytest.approx(1 + 3 / 8)  # 8 sequences per DP rank, micro-batch 1
    assert workload("pp=4+tp=2+fsdp", virtual_stages=4).bubble(64) == pytest.approx(1 + 3 / 32)
    assert workload("pp=4+tp=2+fsdp", micro_batch_size=0).bubble(64) == 1.0  # schedule unknown: not modelled
    assert workload("tp=2+fsdp").bubble(64) == 1.0
    p = step_time(w, H100, 64, 8, 1000.0)
    assert p.idle_ms > 0 and p.step_ms > 1000.0 * (1 + 3 / 8)
    assert collectives(w, H100, 64, 8).p2p_ms > 0
    # stage-to-stage sends: inside a node while a stage spans less than one, across nodes otherwise
    assert point_to_point(H100, True, 1e6).time_us < point_to_point(H100, False, 1e6).time_us


def test_a_pipelined_step_runs_at_its_slowest_stage():
    w, out = workload("pp=4+fsdp"), 6 * 128256 * 4096 / (6 * 218103808 + 12 * 4096 * 8192)
    assert w.stage_compute_factor(32) == pytest.approx(4 * 9 / (32 + out))  # the first stage's 9 blocks
    assert w.stage_compute_factor(32, stage=3) == pytest.approx(4 * (7 + out) / (32 + out))
    assert sum(w.stage_compute_factor(32, stage=i) for i in range(4)) == pytest.approx(4)  # the mean device's
    assert workload("fsdp").stage_compute_factor(32) == 1.0
    # any split: an even 8/8/8/8 leaves the output layer's 1.84 blocks on the last stage (1.163, as
    # bench/results/2026-12-05-pp-stages-h200.md models it), and the factors average to 1
    even = stage_factors((8, 8, 8, 8), out)
    assert max(even) == pytest.approx(4 * (8 + out) / (32 + out)) == pytest.approx(1.163, abs=1e-3)
    assert sum(even) == pytest.approx(4)
    assert stage_factors((9, 8, 8, 7), out) == pytest.approx([w.stage_compute_factor(32, stage=i) for i in range(4)])
    compiled, weight = workload("pp=4+fsdp", compile=True), 2.5048  # the output layer's time in compiled blocks'
    assert compiled.stage_layers(32) == 9 and compiled.stage_compute_factor(32) == pytest.approx(
        4 * 9 / (32 + weight), rel=1e-4
    )  # the split 9/9/8/6: its last stage weighs 8.5
    # the slower stage's extra work is the other stages' wait, reported as idle time
    flat = dataclasses.replace(w, micro_batch_size=0)  # no bubble and no straggler spread: only the imbalance is idle
    p = step_time(flat, H100.model_copy(update={"device_speed_cv": 0.0}), 32, 8, 1000.0)
    assert p.idle_ms == pytest.approx(1000.0 * (w.stage_compute_factor(32) - 1), rel=1e-3)
    assert p.step_ms > 1000.0 * w.stage_compute_factor(32)


def test_pipeline_stages_keep_their_blocks_gathered_and_reduce_after_the_last_micro_batch():
    # torch.distributed.pipelining, as the runner and TorchTitan run FSDP under pp: no re-gather before the backward
    # (reshard_after_forward off), and the gradients reduce-scattered in its REDUCE_GRAD action, after every backward
    net = H100.model_copy(update={"device_speed_cv": 0.0})
    w = workload("pp=4+fsdp", micro_batch_size=1)
    assert not w.reshards_after_forward(64) and w.dp_overlap_mode(64) == "reduce-after"
    assert workload("fsdp").reshards_after_forward(64) and workload("fsdp").dp_overlap_mode(64) == "overlapped"
    assert w.micro_batches(64) == 8 and workload("fsdp").micro_batches(64) == 1  # the runner's step: one micro-batch
    c, layers = collectives(w, net, 64, 8), w.stage_layers(64)
    p = step_time(w, net, 64, 8, 1000.0)
    p2p = 2 * 3 * c.p2p_ms
    # one gather of each block and the root a step, one reduction of each
    assert p.communication_ms == pytest.approx(layers * (c.ag_block + c.rs_block) + c.ag_root + c.rs_root + p2p)
    # every reduce-scatter exposed, and the gathers beside the first micro-batch's forward only
    assert p.exposed_communication_ms >= layers * c.rs_block + c.rs_root + c.ag_block + c.ag_root + p2p - 1e-9
    regather = dataclasses.replace(w, reshard_after_forward=True)
    assert step_time(regather, net, 64, 8, 1000.0).communication_ms == pytest.approx(
        p.communication_ms + (layers - 1) * c.ag_block
    )
    # Megatron-Core's overlap: gathers beside the first micro-batch, reductions beside the last one's backward
    overlapped = step_time(dataclasses.replace(w, dp_overlap="overlapped"), net, 64, 8, 1000.0)
    assert overlapped.communication_ms == pytest.approx(p.communication_ms)
    assert overlapped.exposed_communication_ms < p.exposed_communication_ms
    # DeepSpeed's pipeline engine: every data-parallel collective exposed
    none = step_time(dataclasses.replace(w, dp_overlap="none"), net, 64, 8, 1000.0)
    assert none.exposed_communication_ms == pytest.approx(none.communication_ms)
    assert none.step_ms > p.step_ms > overlapped.step_ms
    # every schedule moves the same collectives; "none" only exposes them (FSDP's re-gathers before the backward too)
    for wl in (w, workload("fsdp")):
        kept = step_time(wl, net, 64, 8, 1000.0).communication_ms
        exposed = step_time(dataclasses.replace(wl, dp_overlap="none"), net, 64, 8, 1000.0)
        assert exposed.communication_ms == pytest.approx(kept) == pytest.approx(exposed.exposed_communication_ms)
    with pytest.raises(ValueError, match="dp_overlap: 'later' is not one of overlapped, reduce-after, none"):
        workload("fsdp", dp_overlap="later")


def test_a_data_parallel_collective_overlaps_one_micro_batch_not_the_whole_step():
    # the same step in 1 or 16 micro-batches: the per-step gathers and reductions hide behind one micro-batch's
    # compute, so with more micro-batches more of them is exposed
    net = H100.model_copy(update={"device_speed_cv": 0.0})
    one = workload("pp=2+fsdp", micro_batch_size=8, dp_overlap="overlapped")
    many = dataclasses.replace(one, micro_batch_size=1)
    assert one.micro_batches(64) == 1 and many.micro_batches(64) == 8
    a, b = step_time(one, net, 64, 8, 200.0), step_time(many, net, 64, 8, 200.0)
    sends = [2 * collectives(w, net, 64, 8).p2p_ms for w in (one, many)]  # a micro-batch's fill and drain sends
    assert a.communication_ms - sends[0] == pytest.approx(b.communication_ms - sends[1])
    assert b.exposed_communication_ms > a.exposed_communication_ms


def test_a_context_parallel_rank_pays_its_measured_attention_cost():
    from core.projection.step_model import cp_attention_cost

    assert cp_attention_cost(1) == 1.0 and cp_attention_cost(2) == 2.20 and cp_attention_cost(4) == 2.61
    assert cp_attention_cost(8) == pytest.approx(2.61 + 0.41)  # log-linear past the measured C
    w = workload("cp=2+fsdp")
    causal = 6 * 32 * 32 * 128 * 8192
    share = causal / (w.model_shape().flops_per_token(8192) - causal)
    assert 0.12 < share < 0.13  # 8b at 8,192 tokens: attention's share of the step's time
    assert w.cp_compute_factor(16) == pytest.approx(1 + share * 1.20)
    assert workload("fsdp").cp_compute_factor(16) == 1.0
    p = step_time(w, H100, 16, 8, 1000.0)
    assert p.compute_ms == pytest.approx(1000.0 * w.cp_compute_factor(16))  # compute, not idle or communication
    assert p.step_ms >= p.compute_ms


def test_context_parallel_exchanges_keys_and_values_and_syncs_gradients_over_dp_x_cp():
    w = workload("cp=2+fsdp")
    g = groups(w, 16, 8)
    assert g["cp"].size == 2 and g["shard"].size == 16
    c = collectives(w, H100, 16, 8)
    assert c.cp_fwd_block > 0 and c.cp_bwd_block == pytest.approx(2 * c.cp_fwd_block)
    assert w.tokens_per_step(16) == 8 * 8 * 8192  # 8 DP ranks of 8 sequences: CP splits sequences, not batches


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(["fsdp", "pp=2+fsdp", "pp=4+tp=2+fsdp", "cp=2+fsdp", "pp=2+cp=2+tp=2+fsdp", "cp=2+ddp"]),
    platform=st.sampled_from(["h100-hgx", "mi325x-platform", "gb200-nvl72"]),
    x0=st.floats(min_value=100.0, max_value=1e6),
)
def test_weak_scaling_efficiency_never_rises_with_n_and_every_point_is_answered(layout, platform, x0):
    net = Network(platform=platform, nic="ib-400g")
    report = project_report(build_report(runs({8: x0})), SPEC, used(net), [16, 64, 256, 1024, 4096], layouts=[layout])
    (s,) = [s for s in report.series if s.key.layout == layout] if layout != "fsdp" else report.series
    effs = [p.efficiency for p in sorted(s.points, key=lambda p: p.num_devices) if p.num_devices >= 16]
    assert len(effs) == 5 and all(math.isfinite(e) and e > 0 for e in effs)
    assert all(b <= a + 1e-9 for a, b in zip(effs, effs[1:], strict=False))


# --------------------------------------------------------------------------- projection and plan with pp / cp


def test_projection_lays_a_measured_series_out_as_pp_and_cp():
    report = project_report(
        build_report(runs({8: 6000.0, 64: 5900.0})),
        SPEC,
        used(H100),
        [8, 64, 512, 1024],
        layouts=["pp=4+tp=2+fsdp", "cp=2+fsdp", "fsdp"],
    )
    layouts = [s.key.layout for s in report.series]
    assert layouts == ["fsdp", "pp=4+tp=2+fsdp", "cp=2+fsdp"]  # the measured layout is not projected twice
    pp = {p.num_devices: p for p in report.series[1].points}
    assert set(pp) == {8, 64, 512, 1024} and all(p.status == "projected" for p in pp.values())
    assert all(p.measured_tokens_per_sec is None for p in pp.values())
    assert "projected onto layout pp=4+tp=2+fsdp" in report.series[1].notes[0]
    assert pp[1024].efficiency_low < pp[1024].efficiency < pp[1024].efficiency_high
    assert pp[8].efficiency < 1.0  # the bubble: one pipeline of 2 sequences a step costs what fsdp does not
    cp = {p.num_devices: p for p in report.series[2].points}
    factor = Workload("8b", 32, "bf16", "cp=2+fsdp", seq_len=8192, local_batch_size=2).cp_compute_factor(8)
    assert cp[8].compute_ms == pytest.approx(factor * report.series[0].points[0].compute_ms)
    fsdp8 = report.series[0].points[0]
    # CP's attention costs more than its FLOP share, and each block exchanges keys and values besides the gradients
    assert cp[8].efficiency < 1 and cp[8].communication_ms > fsdp8.communication_ms


def test_plan_for_1024_gpus_of_an_8b_model_on_mi325x_lists_its_interval():
    report = build_report(runs({8: 7000.0}))
    counts = plan_counts([8], 1024)
    projected = project_report(report, SPEC, used(MI325X), counts, layouts=["pp=2+fsdp", "cp=2+fsdp"])
    plan = build_plan(report, projected, tokens=1e12, max_gpus=1024)
    row = next(r for r in plan.rows if r.num_devices == 1024)
    assert {o.layout for o in row.options} == {"fsdp", "pp=2+fsdp", "cp=2+fsdp"}
    for o in row.options:
        assert o.source == "projected"
        assert o.efficiency_low < o.efficiency < o.efficiency_high
        assert o.time_to_train_hours_low < o.time_to_train_hours < o.time_to_train_hours_high


def test_a_plan_weighs_pp_and_cp_over_each_measured_layout_by_default():
    assert default_plan_layouts(["fsdp", "tp=2+fsdp", "fsdp", "pp=2+fsdp"]) == [
        "pp=2+fsdp",
        "pp=4+fsdp",
        "pp=8+fsdp",
        "cp=2+fsdp",
        "pp=2+tp=2+fsdp",
        "pp=4+tp=2+fsdp",
        "pp=8+tp=2+fsdp",
        "cp=2+tp=2+fsdp",
    ]  # a measured pp / cp layout gets no second prefix
    assert default_plan_layouts([]) == []


def test_a_layout_projected_from_another_keeps_the_measured_global_batch():
    assert [model_parallel_size(t) for t in ("fsdp", "hsdp:shard=8", "tp=2+fsdp", "pp=4+tp=2+fsdp", "cp=2+ddp")] == [
        1,
        1,
        2,
        8,
        2,
    ]
    report = project_report(
        build_report(runs({8: 6000.0})), SPEC, used(H100), [64], layouts=["pp=4+tp=2+fsdp", "cp=2+fsdp"]
    )
    notes = {s.key.layout: s.notes[0] for s in report.series[1:]}
    # 2 sequences per fsdp rank at 64 GPUs: 128 a step; pp=4+tp=2 has 8 ranks of 16, cp=2 has 32 ranks of 4
    assert notes["pp=4+tp=2+fsdp"].endswith("at the measured global batch (16 sequences per data-parallel rank)")
    assert notes["cp=2+fsdp"].endswith("at the measured global batch (4 sequences per data-parallel rank)")
    # a wider measured rank: tp=4+fsdp at 1 sequence a rank is half a sequence per pp=2+fsdp rank, rounded up
    one = SPEC | {"local_batch_size": 1}
    wide = project_report(
        build_report(runs({8: 6000.0}, layout="tp=4+fsdp")), one, used(H100), [64], layouts=["pp=2+fsdp"]
    )
    rounded = "at 1 sequence per data-parallel rank (the measured global batch is not a whole number of sequences"
    assert rounded in wide.series[1].notes[0]


def test_a_pipeline_deeper_than_the_model_is_not_projected():
    shallow = [dataclasses.replace(r, num_layers=4) for r in runs({8: 6000.0})]
    report = project_report(build_report(shallow), SPEC, used(H100), [8, 64], layouts=["pp=4+fsdp", "pp=8+fsdp"])
    by_layout = {s.key.layout: s for s in report.series}
    assert {p.num_devices for p in by_layout["pp=4+fsdp"].points} == {8, 64}  # one block per stage
    assert by_layout["pp=8+fsdp"].points == []
    assert "pp=8 stages, more than the model's 4 blocks" in by_layout["pp=8+fsdp"].notes[-1]


def test_megatron_buckets_grow_with_the_data_parallel_group():
    per_block = workload("ddp")
    megatron = workload("ddp", dp_buckets="megatron")
    # max(40M, 1M x DP x CP) parameters a bucket; an 8B block holds ~218M: one block per bucket up to DP 218
    assert per_block.blocks_per_unit(1024) == 1 and megatron.blocks_per_unit(128) == 1
    assert megatron.blocks_per_unit(1024) == 4 and megatron.blocks_per_unit(2 * 1024) == 9
    assert megatron.blocks_per_unit(1 << 16) == 32  # never more than the stage's blocks
    c1, c4 = collectives(per_block, H100, 1024, 8), collectives(megatron, H100, 1024, 8)
    assert c4.ar_block > 3 * c1.ar_block  # one call carries four blocks' gradients


def test_a_measured_pipeline_series_is_projected_as_itself():
    """The runner measures pp=P+ layouts now: such a series is projected from its own N0, with its own bubble, and
    its measured points carry their error."""
    spec = SPEC | {"local_batch_size": 4}
    report = project_report(
        build_report(runs({2: 6000.0, 4: 5950.0, 8: 5900.0}, layout="pp=2+fsdp")), spec, used(H100), [2, 4, 8, 64]
    )
    [series] = report.series
    assert series.key.layout == "pp=2+fsdp"
    points = {p.num_devices: p for p in series.points}
    assert points[4].measured_tokens_per_sec == pytest.approx(4 * 5950.0) and points[4].efficiency_error_pp is not None
    assert points[64].status == "projected" and points[64].efficiency <= points[8].efficiency + 1e-9
    assert not any("projected onto layout" in n for n in series.notes)  # its own layout, not laid out anew


def test_an_interleaved_pipeline_hides_a_chunks_collectives_behind_other_chunks_micro_batches():
    # Megatron-Core's interleaved 1F1B: chunk c's gathers (2 <= c < v) run beside chunk c-1's forward of P
    # micro-batches, its reductions (c >= 1) beside the next chunk's backward of P micro-batches
    net = H100.model_copy(update={"device_speed_cv": 0.0, "collective_sm_fraction": 0.0})
    base = workload("pp=4+tp=2+fsdp", micro_batch_size=1, local_batch_size=32, dp_overlap="overlapped")
    plain = step_time(base, net, 64, 8, 1000.0)

    def busy(p):  # the stage's time but idle (bubble, imbalance) and exposed communication: its compute
        return p.step_ms - p.idle_ms - p.exposed_communication_ms

    for v in (2, 4, 8):
        w = dataclasses.replace(base, virtual_stages=v)
        assert w.interleaved_windows(64)
        p = step_time(w, net, 64, 8, 1000.0)
        # the same collectives, less of them exposed, and the same compute: the windows only move it
        assert p.communication_ms == pytest.approx(plain.communication_ms)
        assert p.exposed_communication_ms < plain.exposed_communication_ms
        assert busy(p) == pytest.approx(busy(plain), rel=1e-12)
    # only overlapped collectives of an interleaved pipeline: reduce-after, v = 1 or no pp keep one micro-batch
    for w in (
        dataclasses.replace(base, virtual_stages=4, dp_overlap="reduce-after"),
        dataclasses.replace(base, virtual_stages=1),
        workload("tp=2+fsdp", virtual_stages=4),
    ):
        assert not w.interleaved_windows(64)
    # a window of P micro-batches: with one micro-batch per data-parallel rank there is none to widen into
    one = dataclasses.replace(base, local_batch_size=1)
    assert step_time(dataclasses.replace(one, virtual_stages=4), net, 64, 8, 1000.0).exposed_communication_ms == (
        pytest.approx(step_time(one, net, 64, 8, 1000.0).exposed_communication_ms)
    )


def test_a_tp_degree_that_splits_a_head_is_not_projected_and_the_plan_says_why():
    # the 8b shape has 8 key/value heads: tp=16 cannot split them, as POST /experiments refuses it
    report = build_report(runs({8: 6000.0}))
    counts = plan_counts([8], 64)
    projected = project_report(report, SPEC, used(H100), counts, layouts=["tp=16+fsdp", "pp=64+fsdp"])
    by_layout = {s.key.layout: s for s in projected.series}
    assert by_layout["tp=16+fsdp"].points == []
    assert by_layout["tp=16+fsdp"].cannot_run == {
        8: "N not a multiple of the 16 devices a data-parallel rank spans"
    } | {n: "tp degree 16 does not divide num_kv_heads(8)" for n in (16, 32, 64)}
    assert "(tp degree 16 does not divide num_kv_heads(8))" in by_layout["tp=16+fsdp"].notes[-1]
    plan = build_plan(report, projected, tokens=1e12, max_gpus=64)
    assert {o.layout for r in plan.rows for o in r.options} == {"fsdp"}
    assert "layout tp=16+fsdp cannot run at N=16, 32, 64 (tp degree 16 does not divide num_kv_heads(8))" in plan.notes
    # N=8 to 32 are no multiple of pp=64's 64 ranks, N=64 is a stage per block too many
    assert (
        "layout pp=64+fsdp cannot run at N=8, 16, 32 (N not a multiple of the 64 devices a data-parallel rank spans)"
        in (plan.notes)
    )
    assert any(n.startswith("layout pp=64+fsdp cannot run at N=64 (pp=64 stages") for n in plan.notes), plan.notes


def test_a_plan_flags_and_notes_counts_beyond_the_cluster():
    report = build_report(runs({8: 6000.0}))
    counts = plan_counts([8], 256)
    small = used(H100).model_copy(update={"max_devices": 64})
    projected = project_report(report, SPEC, small, counts)
    plan = build_plan(report, projected, tokens=1e12, max_gpus=256)
    beyond = {o.num_devices for r in plan.rows for o in r.options if o.beyond_cluster}
    assert beyond == {128, 256}
    assert plan.fastest is not None and plan.fastest.num_devices == 256 and plan.fastest.beyond_cluster
    assert "N=128, 256 exceed cluster 't' (64 devices): planned on its network as if it had that many" in " ".join(
        plan.notes
    )


def test_another_layout_at_n0_is_a_prediction_with_an_interval():
    report = project_report(build_report(runs({8: 6000.0})), SPEC, used(H100), [8], layouts=["cp=2+fsdp"])
    measured, cp = (s.points[0] for s in report.series)
    assert measured.efficiency_low == measured.efficiency == measured.efficiency_high  # measured: no interval
    assert cp.efficiency_low < cp.efficiency < cp.efficiency_high
    assert "its interval at N0=8 too is one doubling's width" in report.series[1].notes[1]
