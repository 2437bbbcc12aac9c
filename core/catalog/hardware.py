"""Peak dense TFLOP/s per device (vendor datasheets), used for MFU, and which low-precision recipes a device runs.

Unknown device: no MFU, never a guess. Dense = without 2:4 sparsity (datasheets often print the sparse figure,
twice the dense one); per GPU = a system's figure divided by its GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.contracts.specs import MX_PRECISIONS


@dataclass(frozen=True)
class DevicePeak:
    match: str  # substring of the device name, lower case
    bf16_tflops: float
    fp8_tflops: float
    mx_tflops: float | None = None  # dense MXFP8 (block-scaled) TFLOP/s; None: no MX tensor cores


# Order matters: the first substring that matches wins (so "mi325" before "mi300", "gb200" before "b200").
PEAKS: tuple[DevicePeak, ...] = (
    # H100 SXM / H200: NVIDIA H100 and H200 datasheets (dense bf16 989.5, fp8 1979 TFLOP/s). Hopper has float8
    # tensor cores but no block-scaled (MX) ones.
    DevicePeak("h200", 989.0, 1979.0),
    DevicePeak("h100", 989.0, 1979.0),  # SXM; the PCIe part is slower and not listed here
    # GB200 (one Blackwell GPU of a Grace Blackwell superchip): GB200 NVL72 datasheet, 72 GPUs: FP16/BF16 360 PF,
    # FP8/FP6 720 PF, both with sparsity -> per GPU dense 2.5 / 5 PF; MXFP8 runs at the FP8 rate on Blackwell.
    DevicePeak("gb200", 2500.0, 5000.0, mx_tflops=5000.0),
    # B200: DGX/HGX B200 datasheet, 8 GPUs: FP16/BF16 36 PF (sparse) -> 2.25 PF dense per GPU; FP8/FP6 72 PF
    # (sparse) -> 4.5 PF dense per GPU; MXFP8 at the FP8 rate (Blackwell 5th-generation tensor cores).
    DevicePeak("b200", 2250.0, 4500.0, mx_tflops=4500.0),
    # MI355X: AMD Instinct MI355X datasheet: FP16/BF16 2.5 PF dense, FP8 5.0 PF dense, MXFP8 5.0 PF dense
    # (CDNA 4 adds MX formats).
    DevicePeak("mi355", 2500.0, 5000.0, mx_tflops=5000.0),
    # MI350X: AMD Instinct MI350X datasheet: FP16/BF16 2.3 PF dense, FP8 4.6 PF dense, MXFP8 4.6 PF dense (the
    # MI355X's CDNA 4 die at a lower clock and power). Before the gfx950 fallback, which reads as an MI355X.
    DevicePeak("mi350", 2300.0, 4600.0, mx_tflops=4600.0),
    # MI325X / MI300X: AMD datasheets, FP16/BF16 1307.4 TFLOP/s and FP8 2614.9 TFLOP/s dense; CDNA 3 has no MX
    # formats.
    DevicePeak("mi325", 1307.0, 2615.0),
    DevicePeak("mi300x", 1307.0, 2615.0),
)

# gfx architecture -> marketing family, for AMD devices whose name is empty or generic.
GCN_ARCH_NAMES = {"gfx942": "mi300x", "gfx950": "mi355x"}


def find_peak(device_name: str, gcn_arch: str | None = None) -> DevicePeak | None:
    name = device_name.lower()
    if "h100" in name and "pcie" in name:
        return None
    for peak in PEAKS:
        if peak.match in name:
            return peak
    if gcn_arch:
        family = GCN_ARCH_NAMES.get(gcn_arch.split(":")[0])
        if family:
            return find_peak(family)
    return None


def needs_mx_tensor_cores(precision: str) -> bool:
    """MX recipes that run torchao's MX kernels (all but the emulated one, which runs anywhere)."""
    return precision in MX_PRECISIONS and precision != "mxfp8-emulated"


def peak_tflops(device_name: str, precision: str, gcn_arch: str | None = None) -> tuple[float | None, float | None]:
    """(bf16 peak, the precision's own peak) in TFLOP/s; None where the device is unknown."""
    peak = find_peak(device_name, gcn_arch)
    if peak is None:
        return None, None
    if needs_mx_tensor_cores(precision):
        own = peak.mx_tflops  # None on a device without MX tensor cores (the run is refused there anyway)
    elif precision.startswith("fp8"):
        own = peak.fp8_tflops
    elif precision == "fp32":
        own = None  # fp32 dense peaks are not in the table; report against bf16 only
    else:
        own = peak.bf16_tflops  # bf16, and mxfp8-emulated (its GEMMs run in bf16)
    return peak.bf16_tflops, own


def unsupported_reason(precision: str, vendor: str, device_name: str, gcn_arch: str | None = None) -> str | None:
    """Why a device cannot run a precision, or None. CPU clusters run every recipe emulated (tests, the demo).

    MX recipes with real kernels need MX (block-scaled) tensor cores: NVIDIA B200/GB200 and AMD MI350X / MI355X in the
    table above. Note: torchao 0.18's dense MXFP8 linear casts along dim 1 with a CUDA kernel of its own, so on
    MI350X / MI355X the recipe is a hardware capability, not a path tested here."""
    if vendor == "cpu" or not needs_mx_tensor_cores(precision):
        return None
    peak = find_peak(device_name, gcn_arch)
    if peak is None:
        return f"{precision} needs MX tensor cores; {device_name!r} is not in the device table"
    if peak.mx_tflops is None:
        return (
            f"{precision} needs MX tensor cores (B200/GB200, MI350X/MI355X); {device_name} has none "
            "(mxfp8-emulated runs there, for numerics)"
        )
    return None


def fp8_dtype_names(vendor: str, device_name: str, gcn_arch: str | None = None) -> tuple[str, str]:
    """The float8 dtypes torchao picks (forward e4m3, gradients e5m2): the fnuz variants on MI300 (gfx942)."""
    arch = (gcn_arch or "").split(":")[0]
    if vendor == "amd" and (arch == "gfx942" or "mi300" in device_name.lower() or "mi325" in device_name.lower()):
        return "float8_e4m3fnuz", "float8_e5m2fnuz"
    return "float8_e4m3fn", "float8_e5m2"
