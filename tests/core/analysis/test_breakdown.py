"""core.analysis.breakdown: the interval arithmetic (exact, on small timelines), the category rules on real names (the
H200 kernels bench/profile_fp8.py recorded, and a CPU trace recorded here at test time by the runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.analysis.breakdown import (
    ATTENTION,
    COMMUNICATION,
    ELEMENTWISE,
    FP8_CAST,
    GEMM_BF16,
    GEMM_FP8,
    OPTIMIZER,
    PARTITION,
    Event,
    Window,
    category,
    rank_breakdown,
    timeline_from_chrome_trace,
    track_pieces,
)

REPO = Path(__file__).resolve().parents[3]


def _one(events, start=0.0, end=25_000.0):
    return rank_breakdown(0, events, [Window(0, start, end)])


# ------------------------------------------------------------------------------------------ intervals


def test_exposed_is_communication_without_compute_not_a_sum():
    """compute 0-10 ms on one stream, a collective 5-20 ms on another, window 0-25 ms."""
    b = _one([Event("triton_poi_fused_add_0", 0, 10_000, "s7"), Event("ncclDevKernel_AllGather", 5_000, 20_000, "s9")])
    assert b.step_ms == 25 and b.elementwise_ms == 10
    assert b.communication_ms == 15 and b.exposed_communication_ms == 10 and b.overlapped_communication_ms == 5
    assert b.idle_ms == 5
    assert sum(getattr(b, k) for k in PARTITION) == pytest.approx(b.step_ms)


def test_two_collectives_at_once_count_once():
    b = _one(
        [Event("ncclDevKernel_AllGather", 0, 10_000, "s1"), Event("ncclDevKernel_ReduceScatter", 5_000, 12_000, "s2")],
        end=12_000,
    )
    assert b.communication_ms == 12 and b.exposed_communication_ms == 12 and b.idle_ms == 0


def test_concurrent_compute_on_two_tracks_splits_the_time():
    b = _one([Event("aten::mm", 0, 10_000, "t1"), Event("aten::add", 0, 10_000, "t2")], end=10_000)
    assert b.gemm_bf16_ms == 5 and b.elementwise_ms == 5 and b.idle_ms == 0


def test_annotation_time_is_not_work_and_names_classify_what_runs_inside():
    """FSDP::all_gather (a range) waits 8 of 10 ms around a 2 ms copy; a gloo collective runs on its thread."""
    b = _one(
        [
            Event("FSDP::all_gather", 0, 10_000, "main", work=False),
            Event("aten::copy_", 1_000, 3_000, "main"),
            Event("gloo:all_gather", 2_000, 9_000, "gloo", work=True),
            Event("aten::copy_", 8_000, 9_000, "gloo"),
        ],
        end=10_000,
    )
    assert b.elementwise_ms == 2  # the copy on the main thread; the one inside gloo:* is communication
    assert b.communication_ms == 7 and b.overlapped_communication_ms == 1 and b.exposed_communication_ms == 6
    assert b.idle_ms == 2


def test_children_are_clipped_to_their_parent_and_windows_clip_everything():
    pieces = track_pieces(
        [Event("aten::linear", 0, 10, "t"), Event("aten::mm", 2, 11, "t"), Event("aten::add", 12, 14, "t")]
    )
    assert pieces == [(0, 2, GEMM_BF16), (2, 10, GEMM_BF16), (12, 14, ELEMENTWISE)]
    b = rank_breakdown(0, [Event("aten::add", 0, 30_000, "t")], [Window(3, 10_000, 20_000), Window(4, 20_000, 24_000)])
    assert b.step_ms == 7 and b.elementwise_ms == 7  # mean over the two windows


def test_no_window_is_an_error():
    with pytest.raises(ValueError, match="no step window"):
        rank_breakdown(0, [Event("aten::add", 0, 1, "t")], [])


# ----------------------------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    "stack, expected",
    [
        (("c10d::_allgather_base_",), COMMUNICATION),
        (("gloo:all_reduce", "aten::copy_"), COMMUNICATION),
        (("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",), COMMUNICATION),
        (("FSDP::all_gather", "fsdp::all_gather_copy_in", "aten::cat"), ELEMENTWISE),
        (("Optimizer.step#AdamW.step", "aten::_foreach_add_"), OPTIMIZER),
        (("aten::_foreach_norm", "PythonSubclass", "aten::linalg_vector_norm"), OPTIMIZER),
        (("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"), ATTENTION),
        (("aten::linear", "aten::matmul", "aten::mm"), GEMM_BF16),
        # torchao, emulated on CPU: the GEMM on float8 tensors dispatches to a Python subclass that dequantizes
        (("matmul_with_hp_or_float8_args", "aten::mm", "PythonSubclass", "aten::mm"), GEMM_FP8),
        (("matmul_with_hp_or_float8_args", "aten::mm", "PythonSubclass", "aten::div"), GEMM_FP8),
        (("matmul_with_hp_or_float8_args", "aten::abs"), FP8_CAST),
        (("matmul_with_hp_or_float8_args", "_ToFloat8ConstrFunc", "aten::_to_copy"), FP8_CAST),
        # rowwise-gw-hp: the weight-gradient GEMM in high precision inside the float8 backward
        (("matmul_with_hp_or_float8_argsBackward", "aten::mm"), GEMM_BF16),
        (("aten::mm", "PythonSubclass", "aten::_scaled_mm"), GEMM_FP8),
        (("aten::add",), ELEMENTWISE),
    ],
)
def test_rules_on_cpu_stacks(stack, expected):
    assert category(stack) == expected


def test_rules_agree_with_profile_fp8_on_h200_kernels():
    """Every kernel name bench/profile_fp8.py recorded on the H200 (8b x4 layers, four recipes): GEMMs, attention
    and optimizer kernels fall in the same category; its 'triton fused' kernels split into fp8 cast (those that
    fuse an amax, scale or float8 cast) and elementwise; bf16 has no cast kernel."""
    recorded = json.loads((REPO / "bench/results/2026-12-02-profile-fp8.json").read_text())
    same = {"gemm bf16": GEMM_BF16, "gemm fp8": GEMM_FP8, "optimizer": OPTIMIZER, "communication": COMMUNICATION}
    seen = set()
    for precision, row in recorded.items():
        for k in row["top_kernels"]:
            mine = category((k["name"],))
            seen.add(mine)
            if k["category"] in same:
                assert mine == same[k["category"]], k
            elif k["category"].startswith("triton fused"):
                assert mine in (FP8_CAST, ELEMENTWISE), k
                assert precision != "bf16" or mine == ELEMENTWISE, k
            elif k["category"] == "attention":
                assert mine in (ATTENTION, FP8_CAST), k  # a cast fused into attention's backward counts as cast
    assert {GEMM_BF16, GEMM_FP8, FP8_CAST, ATTENTION, OPTIMIZER, ELEMENTWISE} <= seen


# ---------------------------------------------------------------------------- a trace recorded here


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One process (gloo, world size 1), fp8-tensorwise emulated, debug shape: 4 steps, the last 2 profiled."""
    from core.contracts.specs import RunSpec, resolve_layout
    from runner.profiling import read_trace
    from runner.train import run

    out = tmp_path_factory.mktemp("trace")
    spec = RunSpec(
        model="debug",
        num_layers=1,
        precision="fp8-tensorwise",
        layout="fsdp",
        degrees=resolve_layout("fsdp", 1),
        scaling="weak",
        seq_len=32,
        local_batch_size=2,
        steps=4,
        warmup_steps=1,
        profile_steps=2,
    )
    result = run(spec, trace_dir=out)
    assert result.status == "succeeded", result.error
    return result, read_trace(out / "trace.rank0.json.gz")


@pytest.mark.slow
def test_rules_on_a_recorded_cpu_trace(recorded):
    result, trace = recorded
    events, windows, timeline = timeline_from_chrome_trace(trace)
    assert timeline == "cpu" and [w.step for w in windows] == result.breakdown.profiled_steps == [2, 3]
    again = rank_breakdown(0, events, windows)
    assert again == result.breakdown.per_rank[0]  # the runner's figures are these rules over its own trace
    cats = {}
    by_track: dict[str, list[Event]] = {}
    for e in events:
        by_track.setdefault(e.track, []).append(e)
    for evs in by_track.values():  # the category of each op as the timeline sees it (innermost, with its stack)
        stack: list[tuple[float, tuple[str, ...]]] = []
        for e in sorted(evs, key=lambda e: (e.start_us, -e.end_us)):
            while stack and stack[-1][0] <= e.start_us:
                stack.pop()
            names = (stack[-1][1] if stack else ()) + (e.name,)
            stack.append((e.end_us, names))
            cats.setdefault(e.name, set()).add(category(names))
    assert cats["_ToFloat8ConstrFunc"] == {FP8_CAST}
    assert cats["aten::abs"] == {FP8_CAST}  # the amax of every float8 cast; the model itself has no abs
    assert cats["aten::mm"] == {GEMM_FP8, GEMM_BF16}  # emulated float8 GEMMs; the output layer in bf16
    assert cats["aten::_scaled_dot_product_flash_attention_for_cpu"] == {ATTENTION}
    assert OPTIMIZER in cats["aten::_foreach_mul_"]
    assert not any(COMMUNICATION in c for c in cats.values())  # one process: no collective
    b = result.breakdown.median
    assert b.gemm_fp8_ms > 0 and b.fp8_cast_ms > 0 and b.gemm_bf16_ms > 0 and b.attention_ms > 0
    assert b.communication_ms == 0 and sum(getattr(b, k) for k in PARTITION) == pytest.approx(b.step_ms)


# ------------------------------------------------------------------------------- a GPU trace's shape


def _gpu_trace() -> dict:
    """Kineto's chrome-trace layout on a GPU: CPU ops and runtime launches on the host thread, kernels on the
    device's streams linked to their launch by correlation id. Two steps (5, 6), then the end marker."""
    ev: list[dict] = []
    ext = iter(range(1, 10_000))

    def cpu(name, ts, dur, cat="cpu_op"):
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 100,
                "tid": 100,
                "ts": ts,
                "dur": dur,
                "args": {"External id": next(ext)},
            }
        )
        return ev[-1]["args"]["External id"]

    def launch(op_ext, ts, kernel, start, dur, stream=7):
        corr = next(ext)
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": 100,
                "ts": ts,
                "dur": 2,
                "args": {"External id": op_ext, "correlation": corr},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": {"External id": op_ext, "device": 0, "stream": stream, "correlation": corr},
            }
        )

    for step, t in ((5, 0), (6, 1000)):
        cpu(f"scalebench.step#{step}", t, 900, cat="user_annotation")
        cpu("matmul_with_hp_or_float8_args", t + 10, 100)
        launch(cpu("aten::abs", t + 12, 5), t + 13, "vectorized_elementwise_kernel<AbsFunctor>", t + 100, 50)
        launch(cpu("aten::_scaled_mm", t + 30, 5), t + 31, "nvjet_sm90_qqtst_128x128", t + 150, 300)
        launch(
            cpu("c10d::_allgather_base_", t + 200, 5),
            t + 201,
            "ncclDevKernel_AllGather_RING_LL",
            t + 300,
            400,
            stream=20,
        )
        launch(cpu("aten::add", t + 300, 5), t + 301, "triton_poi_fused_add_0", t + 450, 100)
    cpu("scalebench.profile_end", 1950, 20, cat="user_annotation")
    launch(cpu("aten::zeros", 1951, 5), 1952, "vectorized_elementwise_kernel<FillFunctor>", 2100, 1)
    return {"traceEvents": ev}


def test_gpu_timeline_links_kernels_to_their_launching_ops_and_windows_to_steps():
    events, windows, timeline = timeline_from_chrome_trace(_gpu_trace())
    assert timeline == "gpu"
    # step 5 starts at its first kernel (100); step 6 at its first (1100); the end marker's kernel ends step 6
    assert [(w.step, w.start_us, w.end_us) for w in windows] == [(5, 100, 1100), (6, 1100, 2100)]
    assert len(events) == 8 and all(e.track in ("gpu0:stream7", "gpu0:stream20") for e in events)
    abs_kernel = next(e for e in events if "AbsFunctor" in e.name)
    assert abs_kernel.context[-2:] == ("matmul_with_hp_or_float8_args", "aten::abs")
    b = rank_breakdown(0, events, windows)
    # per step: cast 50 (an abs under a float8 scope), fp8 GEMM 300, elementwise 100; collective 300-700 with
    # compute 300-450 and 450-550: 250 overlapped, 150 exposed; idle = 1000 - 50 - 300 - 100 - 150
    assert (b.fp8_cast_ms, b.gemm_fp8_ms, b.elementwise_ms) == (0.05, 0.3, 0.1)
    assert b.communication_ms == pytest.approx(0.4) and b.overlapped_communication_ms == pytest.approx(0.25)
    assert b.exposed_communication_ms == pytest.approx(0.15) and b.idle_ms == pytest.approx(0.4)
    assert b.step_ms == 1.0
