"""Matrix expansion: precision x layout x N x repeat, skipped points with reasons, stable run keys."""

import pytest

from core.contracts.clusters import LOCAL_CPU, Cluster
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import ExperimentSpec

GPU = Cluster(name="h200-pod", vendor="nvidia", device_name="NVIDIA H200", gpus_per_node=8, max_nodes=4)


def spec(**kw):
    base = dict(
        name="e",
        model="8b",
        cluster="h200-pod",
        gpu_counts=[8, 16, 32],
        precisions=["bf16", "fp8-tensorwise"],
        layouts=["fsdp", "tp=2+fsdp"],
        seq_len=8192,
    )
    return ExperimentSpec(**{**base, **kw})


def test_full_product_with_repeats():
    runs, skipped = expand(spec(repeats=2), GPU)
    assert len(runs) == 2 * 2 * 3 * 2 and skipped == []
    assert {r.device_type for r in runs} == {"cuda"}
    assert {r.num_devices for r in runs} == {8, 16, 32}
    # repeats share the run key; other points do not
    keys = {}
    for r in runs:
        keys.setdefault(r.run_key(), set()).add(r.repeat)
    assert len(keys) == 12 and all(v == {0, 1} for v in keys.values())


def test_weak_vs_strong_batch():
    weak, _ = expand(spec(local_batch_size=2), GPU)
    assert all(r.local_batch_size == 2 and r.global_batch_size == 2 * r.degrees.dp_degree for r in weak)
    strong, skipped = expand(spec(scaling="strong", global_batch_size=64, layouts=["fsdp"]), GPU)
    assert {r.global_batch_size for r in strong} == {64}
    assert [r.local_batch_size for r in strong if r.precision == "bf16"] == [8, 4, 2]


def test_skips_carry_reasons():
    runs, skipped = expand(
        spec(gpu_counts=[1, 8, 64], precisions=["fp8-rowwise", "fp8-tensorwise"], fp8_all_gather=True), GPU
    )
    reasons = {(s.precision, s.layout, s.num_devices): s.reason for s in skipped}
    assert "exceeds cluster" in reasons[("fp8-tensorwise", "fsdp", 64)]
    assert "does not divide" in reasons[("fp8-tensorwise", "tp=2+fsdp", 1)]
    assert "only with fp8-tensorwise" in reasons[("fp8-rowwise", "fsdp", 8)]
    assert all(r.precision == "fp8-tensorwise" and r.fp8_all_gather for r in runs)


def test_mx_points_skipped_where_the_device_has_no_mx_tensor_cores():
    mx = ["bf16", "mxfp8-cublas", "mxfp8-cublas-floor", "mxfp8-emulated"]
    runs, skipped = expand(spec(precisions=mx, gpu_counts=[8]), GPU)
    assert {r.precision for r in runs} == {"bf16", "mxfp8-emulated"}
    reasons = {(s.precision, s.layout): s.reason for s in skipped}
    assert "MX tensor cores" in reasons[("mxfp8-cublas", "fsdp")] and "H200" in reasons[("mxfp8-cublas", "fsdp")]
    assert ("mxfp8-cublas-floor", "fsdp") in reasons
    # on B200 every MX recipe runs, except under tensor parallelism
    b200 = Cluster(name="b200-pod", vendor="nvidia", device_name="NVIDIA B200", gpus_per_node=8, max_nodes=4)
    runs, skipped = expand(spec(cluster="b200-pod", precisions=mx, gpu_counts=[8]), b200)
    assert {(r.precision, r.layout) for r in runs} == {(p, "fsdp") for p in mx} | {("bf16", "tp=2+fsdp")}
    assert {s.precision for s in skipped} == set(mx) - {"bf16"}
    assert all("tensor parallelism" in s.reason for s in skipped)
    # CPU clusters run every recipe emulated
    cpu_runs, cpu_skipped = expand(ExperimentSpec(name="e", model="debug", gpu_counts=[1], precisions=mx), LOCAL_CPU)
    assert {r.precision for r in cpu_runs} == set(mx) and cpu_skipped == []


def test_model_dims_not_divisible_by_tp():
    with pytest.raises(MatrixError) as info:
        expand(spec(model="debug", layouts=["tp=16+fsdp"], gpu_counts=[16], seq_len=128), GPU)
    assert "num_heads(8)" in str(info.value) and "num_kv_heads(4)" in str(info.value)


def test_no_valid_point_names_every_reason():
    s = ExperimentSpec(name="e", model="debug", gpu_counts=[8, 16], precisions=["bf16"])
    with pytest.raises(MatrixError) as info:
        expand(s, LOCAL_CPU)
    assert len(info.value.skipped) == 2
    assert "N=8" in str(info.value) and "N=16" in str(info.value)


def test_run_key_ignores_cluster_and_repeat_but_not_settings():
    a, _ = expand(spec(), GPU)
    b, _ = expand(spec(compile=True), GPU)
    other = Cluster(name="other", vendor="nvidia", device_name="NVIDIA H200", gpus_per_node=8, max_nodes=4)
    c, _ = expand(spec(cluster="other"), other)
    assert a[0].run_key() != b[0].run_key()
    assert a[0].run_key() == c[0].run_key()
