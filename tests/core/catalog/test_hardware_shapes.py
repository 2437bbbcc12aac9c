"""Peak table, fp8 dtype choice, shapes and FLOPs per token (checked by hand)."""

import pytest

from core.catalog.hardware import find_peak, fp8_dtype_names, peak_tflops, unsupported_reason
from core.catalog.shapes import SHAPES, get_shape


@pytest.mark.parametrize(
    "name,arch,bf16,fp8",
    [
        ("NVIDIA H200", None, 989, 1979),
        ("NVIDIA H100 80GB HBM3", None, 989, 1979),
        ("NVIDIA B200", None, 2250, 4500),
        ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 1307, 2615),
        ("AMD Instinct MI325X", None, 1307, 2615),
        ("AMD Instinct MI355X", None, 2500, 5000),
        ("AMD Instinct MI350X", "gfx950", 2300, 4600),  # the name wins over the gfx950 fallback (an MI355X)
        ("", "gfx942:sramecc+:xnack-", 1307, 2615),
        ("", "gfx950", 2500, 5000),
    ],
)
def test_known_peaks(name, arch, bf16, fp8):
    assert peak_tflops(name, "bf16", arch) == (bf16, bf16)
    assert peak_tflops(name, "fp8-rowwise", arch) == (bf16, fp8)


@pytest.mark.parametrize(
    "name,arch,mx",
    [
        ("NVIDIA B200", None, 4500),
        ("NVIDIA GB200", None, 5000),
        ("AMD Instinct MI355X", None, 5000),
        ("", "gfx950", 5000),
        ("AMD Instinct MI350X", "gfx950", 4600),
        ("NVIDIA H200", None, None),
        ("AMD Instinct MI300X", "gfx942", None),
    ],
)
def test_mx_peaks_only_where_mx_tensor_cores_exist(name, arch, mx):
    bf16 = find_peak(name, arch).bf16_tflops
    assert peak_tflops(name, "mxfp8-cublas", arch) == (bf16, mx)
    assert peak_tflops(name, "mxfp8-cublas-floor", arch) == (bf16, mx)
    assert peak_tflops(name, "mxfp8-emulated", arch) == (bf16, bf16)  # its GEMMs run in bf16


def test_gb200_is_not_read_as_b200():
    assert peak_tflops("NVIDIA GB200", "bf16") == (2500, 2500)
    assert peak_tflops("NVIDIA GB200", "fp8-tensorwise") == (2500, 5000)


def test_which_devices_run_which_recipe():
    reason = unsupported_reason("mxfp8-cublas", "nvidia", "NVIDIA H200")
    assert "MX tensor cores" in reason and "H200" in reason
    assert "MX tensor cores" in unsupported_reason("mxfp8-cublas-floor", "amd", "AMD Instinct MI300X")
    assert "not in the device table" in unsupported_reason("mxfp8-cublas", "nvidia", "NVIDIA A10G")
    for vendor, name in (("nvidia", "NVIDIA B200"), ("nvidia", "NVIDIA GB200"), ("amd", "AMD Instinct MI355X")):
        assert unsupported_reason("mxfp8-cublas", vendor, name) is None
    assert unsupported_reason("mxfp8-emulated", "nvidia", "NVIDIA H200") is None
    assert unsupported_reason("mxfp8-cublas", "cpu", "cpu (gloo ranks)") is None  # emulated on CPU
    for precision in ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp"):
        assert unsupported_reason(precision, "nvidia", "NVIDIA H200") is None


@pytest.mark.parametrize("name", ["cpu", "NVIDIA A10G", "NVIDIA H100 PCIe", "AMD Radeon"])
def test_unknown_device_has_no_peak(name):
    assert find_peak(name) is None and peak_tflops(name, "bf16") == (None, None)


def test_fp8_dtypes_per_vendor():
    assert fp8_dtype_names("nvidia", "NVIDIA H200") == ("float8_e4m3fn", "float8_e5m2")
    assert fp8_dtype_names("amd", "AMD Instinct MI300X", "gfx942") == ("float8_e4m3fnuz", "float8_e5m2fnuz")
    assert fp8_dtype_names("amd", "AMD Instinct MI355X", "gfx950") == ("float8_e4m3fn", "float8_e5m2")


def test_published_parameter_counts():
    # Llama-3.1 8B / 70B / 405B: 8.03B, 70.55B, 405.85B parameters (untied embeddings)
    assert round(SHAPES["8b"].num_params() / 1e9, 2) == 8.03
    assert round(SHAPES["70b"].num_params() / 1e9, 2) == 70.55
    assert round(SHAPES["405b"].num_params() / 1e9, 2) == 405.85
    assert SHAPES["8b"].ffn_hidden_dim == 14336 and SHAPES["70b"].ffn_hidden_dim == 28672


def test_flops_per_token_8b_by_hand():
    # 8b: dim 4096, 32 layers, 32 heads (head_dim 128), 8 kv heads (kv dim 1024), ffn 14336, vocab 128256.
    per_layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096  # attn + ffn + 2 norms
    n = 32 * per_layer + 4096 + 128256 * 4096  # + final norm + output projection (embedding excluded)
    assert n == 7_504_924_672  # 8.03B total minus the 0.525B token embedding
    t = 8192
    expected = 6 * n + 12 * 32 * 32 * 128 * t
    assert SHAPES["8b"].flops_per_token(t) == expected == 57_914_449_920  # ~57.9 GFLOP per token
    assert get_shape("8b", 16).flops_per_token(t) < expected


def test_unknown_shape_names_allowed():
    with pytest.raises(ValueError, match="allowed: debug, 1b, 8b, 70b, 405b"):
        get_shape("13b")


def test_output_layer_cost_in_blocks_by_hand():
    s = get_shape("8b")
    block = 6 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 12 * 32 * 128 * 8192
    assert s.output_cost_in_blocks(8192) == pytest.approx(6 * 128256 * 4096 / block)
    assert s.output_cost_in_blocks(8192) == pytest.approx(1.842, abs=1e-3)
    assert get_shape("405b").output_cost_in_blocks(8192) < 1 < s.output_cost_in_blocks(2048)  # attention grows with T


@pytest.mark.parametrize(
    ("model", "layers", "pp", "split"),
    [
        ("8b", 32, 1, (32,)),
        ("8b", 32, 2, (17, 15)),  # the last stage's 15 blocks + 1.84 of output weigh 16.84 <= 17
        ("8b", 32, 4, (9, 8, 8, 7)),  # even 8/8/8/8 would leave the last at 9.84
        ("8b", 32, 8, (5, 4, 4, 4, 4, 4, 4, 3)),
        ("405b", 126, 8, (16, 16, 16, 16, 16, 16, 15, 15)),  # output 0.61 of a block: the even split is the best
        ("1b", 16, 4, (5, 5, 4, 2)),  # a 128k vocabulary on a small model: the output weighs 2.8 blocks
        ("debug", 4, 4, (1, 1, 1, 1)),  # every stage keeps a block
    ],
)
def test_pipeline_split_weighs_the_output_layer(model, layers, pp, split):
    shape = get_shape(model, layers)
    got = shape.pipeline_split(pp, 8192)
    assert got == split and sum(got) == layers and min(got) >= 1
    out = shape.output_cost_in_blocks(8192)
    slowest = max(*got[:-1], got[-1] + out) if pp > 1 else layers + out
    # no contiguous split with at least one block a stage has a faster slowest stage
    for last in range(1, layers - pp + 2):
        rest = layers - last
        best_rest = -(-rest // (pp - 1)) if pp > 1 else 0
        assert slowest <= max(best_rest, last + out) + 1e-12 or pp == 1


def test_compiled_blocks_weigh_the_eager_output_layer_heavier():
    from core.catalog.shapes import COMPILED_OUTPUT_SCALE

    s = get_shape("8b")
    assert s.output_weight(8192) == s.output_cost_in_blocks(8192)
    assert s.output_weight(8192, compiled=True) == pytest.approx(1.842 * COMPILED_OUTPUT_SCALE, abs=1e-2)
    assert s.pipeline_split(4, 8192, compiled=True) == (9, 9, 8, 6)  # slowest max(9, 6 + 2.5) = 9, not 7 + 2.5
    assert s.pipeline_split(8, 8192, compiled=True) == (5, 5, 4, 4, 4, 4, 4, 2)
    assert s.pipeline_split(2, 8192, compiled=True) == s.pipeline_split(2, 8192)


def test_pipeline_split_refuses_more_stages_than_blocks():
    with pytest.raises(ValueError, match=r"pp: needs 1 <= pp <= num_layers \(4\), got 5"):
        get_shape("debug", 4).pipeline_split(5, 256)
