"""Pure runner pieces: FLOPs by hand, peak table and fp8 dtypes per vendor, data, schedule, failures."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.analysis.summary import summarize
from core.catalog.shapes import get_shape
from runner.data import Batches, DataOpenError, MemmapTokens, SyntheticTokens
from runner.env import DeviceInfo, device_info_from, expected_fp8_dtypes, peaks_for
from runner.failures import InvalidConfig, classify, validate
from runner.fp8 import (
    MX_RECIPES,
    apply_float8,
    float8_config,
    fp8_dtypes_of_config,
    fp8_module_filter,
    mx_module_filter,
)
from runner.train import clip_in_optimizer, inductor_settings, lr_factor, run
from tests.runner.conftest import make_spec


def test_flops_per_token_8b_by_hand():
    # Llama-3.1-8B: dim 4096, 32 layers, 32 heads (head_dim 128), 8 kv heads, vocab 128256,
    # ffn hidden int(1.3 * int(2 * 16384 / 3)) = int(1.3 * 10922) = 14198 -> rounded up to 1024s: 14336.
    dim, layers, kv_dim, hidden, vocab, seq = 4096, 32, 8 * 128, 14336, 128256, 8192
    per_layer = 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden + 2 * dim  # wq wo, wk wv, w1 w2 w3, norms
    params_no_embedding = layers * per_layer + dim + vocab * dim  # + final norm + output
    assert params_no_embedding == 7_504_924_672  # 8.03e9 total minus the 525M embedding
    expected = 6 * params_no_embedding + 12 * layers * 32 * 128 * seq
    shape = get_shape("8b")
    assert shape.ffn_hidden_dim == hidden
    # 6 * 7_504_924_672 = 45_029_548_032; 12 * 32 * 32 * 128 * 8192 = 12_884_901_888
    assert shape.flops_per_token(seq) == expected == 57_914_449_920
    # 16-layer bench shape: the output layer stays, half of the blocks go.
    assert get_shape("8b", 16).flops_per_token(seq) == expected - 16 * (6 * per_layer + 12 * 32 * 128 * seq)


# ------------------------------------------------------------------------------- env, peaks, dtypes


def test_nvidia_h200_branch():
    props = SimpleNamespace(name="NVIDIA H200", gcnArchName="should-be-ignored")
    info = device_info_from(props, device_count=8, hip_version=None, cuda_version="13.0")
    assert (info.vendor, info.gcn_arch, info.cuda_version, info.hip_version) == ("nvidia", None, "13.0", None)
    assert peaks_for(info, "bf16") == (989.0, 989.0, None)
    assert peaks_for(info, "fp8-rowwise") == (989.0, 1979.0, None)
    assert expected_fp8_dtypes(info) == ["float8_e4m3fn", "float8_e5m2"]


def test_amd_mi300_branch_uses_fnuz_and_gcn_arch():
    # ROCm builds answer to torch.cuda; torch.version.hip is what tells them apart.
    props = SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-")
    info = device_info_from(props, device_count=8, hip_version="6.3.42131", cuda_version=None)
    assert (info.vendor, info.gcn_arch, info.hip_version, info.cuda_version) == (
        "amd",
        "gfx942:sramecc+:xnack-",
        "6.3.42131",
        None,
    )
    assert peaks_for(info, "fp8-tensorwise") == (1307.0, 2615.0, None)
    assert expected_fp8_dtypes(info) == ["float8_e4m3fnuz", "float8_e5m2fnuz"]


def test_amd_generic_name_falls_back_to_gcn_arch():
    info = device_info_from(
        SimpleNamespace(name="AMD Radeon Graphics", gcnArchName="gfx950"),
        device_count=1,
        hip_version="7.0",
        cuda_version=None,
    )
    assert peaks_for(info, "bf16")[0] == 2500.0  # gfx950 -> MI355X
    assert expected_fp8_dtypes(info) == ["float8_e4m3fn", "float8_e5m2"]  # MI350 series: OCP formats


def test_unknown_devices_get_no_mfu_and_a_note():
    info = device_info_from(
        SimpleNamespace(name="NVIDIA H100 PCIe"), device_count=1, hip_version=None, cuda_version="12.4"
    )
    bf16, own, note = peaks_for(info, "bf16")
    assert bf16 is None and own is None and "H100 PCIe" in note
    cpu = device_info_from(None, device_count=1, hip_version=None, cuda_version=None, cuda_available=False)
    assert cpu.vendor == "cpu" and peaks_for(cpu, "bf16")[:2] == (None, None)
    # fp32 has no own peak in the table: MFU against bf16 only, said so.
    h200 = DeviceInfo("nvidia", "NVIDIA H200", 1)
    assert peaks_for(h200, "fp32")[:2] == (989.0, None) and "fp32" in peaks_for(h200, "fp32")[2]


@pytest.mark.parametrize(
    "precision,expected",
    [
        ("fp8-tensorwise", ["float8_e4m3fn", "float8_e5m2"]),  # e5m2 for gradients
        ("fp8-rowwise", ["float8_e4m3fn"]),
        ("fp8-rowwise-gw-hp", ["float8_e4m3fn"]),
    ],
)
def test_fp8_dtypes_read_off_torchao_configs(precision, expected):
    assert fp8_dtypes_of_config(float8_config(precision, emulate=True, fp8_all_gather=False)) == expected


def test_float8_config_options():
    assert float8_config("fp8-tensorwise", emulate=True, fp8_all_gather=True).enable_fsdp_float8_all_gather
    assert float8_config("fp8-rowwise", emulate=True, fp8_all_gather=False).emulate
    with pytest.raises(ValueError, match="only with fp8-tensorwise"):
        float8_config("fp8-rowwise", emulate=True, fp8_all_gather=True)
    with pytest.raises(ValueError, match="allowed"):
        float8_config("bf16", emulate=True, fp8_all_gather=False)


def test_mx_recipes_and_filter():
    assert fp8_dtypes_of_config(MX_RECIPES["mxfp8-cublas"]) == ["float8_e4m3fn"]  # e4m3 elements, e8m0 scales
    assert (MX_RECIPES["mxfp8-cublas"].scale_mode, MX_RECIPES["mxfp8-cublas-floor"].scale_mode) == ("rceil", "floor")
    assert mx_module_filter(torch.nn.Linear(256, 768, bias=False), "layers.0.feed_forward.w1")
    assert not mx_module_filter(torch.nn.Linear(256, 2048, bias=False), "output")
    assert not mx_module_filter(torch.nn.Linear(256, 272, bias=False), "layers.0.attention.wq")  # 272 % 32 != 0


@pytest.mark.parametrize("precision", ["mxfp8-cublas", "mxfp8-cublas-floor", "mxfp8-emulated"])
def test_mx_linear_emulated_tracks_bf16(precision):
    """One converted Linear under bf16 autocast (fp32 master weight, as the runner trains) against the same
    Linear in bf16: forward and weight gradient within the e4m3 rounding of both operands (measured on normal
    data: 3.6-4.1% with RCEIL scales, 5.6-6.1% with FLOOR), yet not equal to bf16 (the block quantization is
    applied). Fresh random data each run."""
    torch.manual_seed(int.from_bytes(np.random.bytes(4), "little"))
    ref = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False))
    mx = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False))
    mx.load_state_dict(ref.state_dict())
    _, count = apply_float8(mx, precision, emulate=True, fp8_all_gather=False)
    assert count == 1 and type(mx[0]).__name__ == "AutocastMXFP8Linear"
    x = torch.randn(4, 64, 256)
    grads = []
    for model in (ref, mx):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        assert y.dtype == torch.bfloat16
        y.float().pow(2).mean().backward()
        grads.append((y.detach().float(), model[0].weight.grad.clone()))
        assert model[0].weight.grad.dtype == torch.float32  # the master weight keeps fp32 gradients
    (y_ref, g_ref), (y_mx, g_mx) = grads
    err_y = ((y_mx - y_ref).norm() / y_ref.norm()).item()
    err_g = ((g_mx - g_ref).norm() / g_ref.norm()).item()
    assert 2e-3 < err_y < 8e-2 and 2e-3 < err_g < 8e-2, (err_y, err_g)


def test_fp8_filter_skips_output_and_odd_dims():
    assert fp8_module_filter(torch.nn.Linear(256, 768), "layers.0.feed_forward.w1")
    assert not fp8_module_filter(torch.nn.Linear(256, 2048), "output")
    assert not fp8_module_filter(torch.nn.Linear(256, 100), "layers.0.attention.wq")
    assert not fp8_module_filter(torch.nn.Embedding(10, 16), "tok_embeddings")


# -------------------------------------------------------------------------------------------- data


def test_synthetic_tokens_deterministic_and_learnable():
    a, b = SyntheticTokens(2048, seed=3), SyntheticTokens(2048, seed=3)
    assert torch.equal(a.sequence(5, 2, 33), b.sequence(5, 2, 33))
    assert not torch.equal(a.sequence(5, 2, 33), a.sequence(5, 3, 33))
    assert not torch.equal(a.sequence(5, 2, 33), SyntheticTokens(2048, seed=4).sequence(5, 2, 33))
    assert a.entropy_nats < 0.5 * math.log(2048)  # well below ln(vocab)
    seq = a.sequence(0, 0, 4096)
    assert seq.min() >= 0 and seq.max() < 2048
    # Each token has at most NUM_OFFSETS successors: the empirical conditional entropy is low.
    successors: dict[int, set[int]] = {}
    for x, y in zip(seq[:-1].tolist(), seq[1:].tolist()):
        successors.setdefault(x, set()).add(y)
    assert max(len(s) for s in successors.values()) <= 16


def test_batches_depend_on_global_sequence_index_not_layout():
    src = SyntheticTokens(2048, seed=1)
    one = Batches(src, seq_len=16, local_batch_size=4, dp_rank=0, device=torch.device("cpu")).get(3)[0]
    halves = [
        Batches(src, seq_len=16, local_batch_size=2, dp_rank=r, device=torch.device("cpu")).get(3)[0] for r in (0, 1)
    ]
    assert torch.equal(one, torch.cat(halves))
    inputs, labels = Batches(src, seq_len=16, local_batch_size=1, dp_rank=0, device=torch.device("cpu")).get(0)
    assert torch.equal(inputs[0, 1:], labels[0, :-1])


@pytest.mark.parametrize("vocab,dtype", [(2048, np.uint16), (128256, np.uint32)])
def test_memmap_tokens(tmp_path, vocab, dtype):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=dtype).tofile(path)
    src = MemmapTokens(str(path), vocab, seed=0)
    window = src.sequence(step=2, index=1, length=17)
    assert window.dtype == torch.int64 and len(window) == 17
    assert torch.equal(window, torch.arange(int(window[0]), int(window[0]) + 17))
    with pytest.raises(DataOpenError, match="cannot be opened"):
        MemmapTokens(str(tmp_path / "missing.bin"), vocab, seed=0)


# ------------------------------------------------------------------------------ schedule, metrics


@pytest.mark.parametrize("scale", [0.01, 30.0])  # norm below max_norm (no clipping) and far above it
def test_clip_in_fused_adamw_matches_clip_then_step(scale):
    """Folding the clip factor into fused AdamW's grad_scale gives clip_grad_norm_ + step's parameters."""
    torch.manual_seed(int.from_bytes(np.random.bytes(4), "little"))
    a = [torch.nn.Parameter(torch.randn(48, 32)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    start = [p.detach().clone() for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p) * scale
        q.grad = p.grad.clone()
    opt_a = torch.optim.AdamW(a, lr=1e-2, fused=True)
    opt_b = torch.optim.AdamW(b, lr=1e-2, fused=True)
    norm_a = torch.nn.utils.clip_grad_norm_(a, 1.0)
    opt_a.step()
    norm_b = clip_in_optimizer(opt_b, b, 1.0)
    opt_b.step()
    assert norm_b.item() == pytest.approx(norm_a.item(), rel=1e-6)
    for p, q, p0 in zip(a, b, start):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        assert (q.detach() - p0).abs().max() > 1e-4  # the step moved the parameters


def test_rowwise_compiles_with_emulated_precision_casts_for_its_run_only():
    from torch._inductor import config as inductor_config
    from torch.optim.optimizer import register_optimizer_step_post_hook

    assert inductor_settings("fp8-rowwise") == {"emulate_precision_casts": True}
    for precision in ("bf16", "fp8-tensorwise", "fp8-rowwise-gw-hp", "mxfp8-cublas", "fp32"):
        assert inductor_settings(precision) == {}
    before = inductor_config.emulate_precision_casts
    seen = []
    handle = register_optimizer_step_post_hook(lambda *_: seen.append(inductor_config.emulate_precision_casts))
    try:
        for precision in ("fp8-rowwise", "fp8-tensorwise"):
            assert run(make_spec(precision, "fsdp", 1, steps=2, warmup_steps=1)).status == "succeeded"
    finally:
        handle.remove()
    assert seen == [True, True, before, before]  # set while the rowwise run trains, restored afterwards
    assert inductor_config.emulate_precision_casts == before


def test_lr_warmup_then_constant_or_cosine():
    assert [lr_factor(s, 4, 100) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 0, 100) == 1.0
    assert lr_factor(4, 4, 100, "cosine") == pytest.approx(1.0)
    assert lr_factor(100, 4, 100, "cosine") == pytest.approx(0.1)


def test_summary_arithmetic_follows_design():
    s = summarize(
        [999.0, 100.0, 200.0, 300.0],
        warmup_steps=1,
        tokens_per_step=8192,
        num_devices=8,
        flops_per_token=10**9,
        bf16_peak=1000.0,
        own_peak=2000.0,
        mfu_note=None,
        memory=(1.0, 2.0),
        num_float8_linears=3,
    )
    assert s.num_timed_steps == 3 and s.step_ms_median == 200.0 and (s.step_ms_min, s.step_ms_max) == (100.0, 300.0)
    assert s.tokens_per_sec == pytest.approx(8192 / 0.2)
    assert s.tokens_per_sec_per_device == pytest.approx(8192 / 0.2 / 8)
    assert s.tflops_per_device == pytest.approx(8192 / 0.2 / 8 * 1e9 / 1e12)
    assert s.mfu_vs_bf16_peak == pytest.approx(s.tflops_per_device / 1000)
    assert s.mfu_vs_precision_peak == pytest.approx(s.tflops_per_device / 2000)


# -------------------------------------------------------------------------------------- failures


def test_validate_mx_needs_token_blocks_of_32_and_no_tp():
    with pytest.raises(InvalidConfig) as info:
        validate(make_spec("mxfp8-emulated", "tp=2", 2, seq_len=20, local_batch_size=1), 2)
    assert "(20) is not divisible by 32" in str(info.value) and "tensor parallelism" in str(info.value)
    validate(make_spec("mxfp8-emulated", "fsdp", 1), 1)  # 4 x 32 tokens: fine


def test_validate_refuses_a_pipeline_without_enough_micro_batches():
    with pytest.raises(InvalidConfig, match="local_batch_size"):
        validate(make_spec("bf16", "pp=2+fsdp", 2, local_batch_size=1), 2)


def test_validate_names_every_problem():
    spec = make_spec(layout="tp=3", num_devices=3)
    with pytest.raises(InvalidConfig) as err:
        validate(spec, world_size=2)
    msg = str(err.value)
    assert "degrees.world_size(3) != launched world size(2)" in msg
    assert "num_heads(8) of model debug is not divisible by tp(3)" in msg
    assert "num_kv_heads(4)" in msg
    validate(make_spec(layout="tp=2", num_devices=2), world_size=2)  # fine


def test_classify():
    assert classify(InvalidConfig("x")) == "invalid_config"
    assert classify(torch.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert classify(RuntimeError("[gloo] Timed out waiting 5000ms for recv operation")) == "comm_timeout"
    assert classify(torch.distributed.DistBackendError("NCCL watchdog")) == "comm_timeout"
    assert classify(KeyError("x")) == "error"


def test_pipeline_stages_are_the_shapes_split_contiguous_and_whole():
    from runner.parallel import stage_blocks

    eight = get_shape("8b", 32)
    assert [list(stage_blocks(eight, 2, 8192, s)) for s in range(2)] == [list(range(17)), list(range(17, 32))]
    assert [len(stage_blocks(eight, 4, 8192, s, compiled=True)) for s in range(4)] == [9, 9, 8, 6]
    for shape, pp in ((get_shape("debug", 4), 4), (get_shape("debug", 7), 3), (eight, 4), (get_shape("405b"), 8)):
        stages = [stage_blocks(shape, pp, 8192, s) for s in range(pp)]
        assert [len(r) for r in stages] == list(shape.pipeline_split(pp, 8192))
        assert [b for r in stages for b in r] == list(range(shape.num_layers))


def test_keep_stage_keeps_names_and_root_modules():
    from runner.model import Llama
    from runner.parallel import keep_stage

    def stage(index: int) -> Llama:
        with torch.device("meta"):
            model = Llama(get_shape("debug", 4), max_seq_len=16)
        keep_stage(model, 2, index, seq_len=16)
        return model

    first, last = stage(0), stage(1)
    assert list(first.layers) == ["0", "1"] and list(last.layers) == ["2", "3"]
    assert first.tok_embeddings is not None and first.norm is None and first.output is None
    assert last.tok_embeddings is None and last.output is not None
    names = {n for m in (first, last) for n, _ in m.named_parameters()}
    with torch.device("meta"):
        whole = {n for n, _ in Llama(get_shape("debug", 4), max_seq_len=16).named_parameters()}
    assert names == whole  # the seeded init (by name) draws the unsplit model's weights


def test_scalebench_layout_reason():
    from core.contracts.specs import resolve_layout
    from core.engines.registry import scalebench_layout_reason

    pp2 = resolve_layout("pp=2+fsdp", 4)
    assert scalebench_layout_reason(pp2, num_layers=4, local_batch_size=2) is None
    assert "local_batch_size" in scalebench_layout_reason(pp2, num_layers=4, local_batch_size=1)
    assert "num_layers(1)" in scalebench_layout_reason(pp2, num_layers=1, local_batch_size=2)
    assert scalebench_layout_reason(resolve_layout("cp=2+fsdp", 4), seq_len=32) is None
    assert "seq_len(30)" in scalebench_layout_reason(resolve_layout("cp=2+fsdp", 4), seq_len=30)
    assert "use cp=2+tp=2+fsdp" in scalebench_layout_reason(resolve_layout("cp=2+tp=2", 4))
    assert "divisible by 8" in scalebench_layout_reason(resolve_layout("cp=2+tp=2+fsdp", 4), seq_len=36)
    assert scalebench_layout_reason(resolve_layout("pp=2+cp=2+tp=2+fsdp", 8), seq_len=32, local_batch_size=2) is None
    assert scalebench_layout_reason(resolve_layout("tp=2+fsdp", 4), local_batch_size=1) is None


def test_context_pieces_balance_the_causal_work_and_cover_the_sequence():
    from runner.context import ContextShard

    shards = [ContextShard(mesh=None, rank=r, size=4, seq_len=32) for r in range(4)]  # type: ignore[arg-type]
    assert [s.pieces for s in shards] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    seq = torch.arange(32)[None, :]
    held = torch.cat([s.local(seq) for s in shards], dim=1)
    assert sorted(held[0].tolist()) == list(range(32))
    for s in shards:
        assert torch.equal(s.local(seq)[0], s.positions(torch.device("cpu")))
    # keys each rank's queries attend to: (p + 1) x 4 per piece p, the same sum on every rank
    assert {sum((p + 1) * 4 for p in s.pieces) for s in shards} == {36}
