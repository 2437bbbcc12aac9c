"""Peak dense TFLOP/s per device (vendor datasheets), used for MFU. Unknown device: no MFU, never a guess."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    match: str  # substring of the device name, lower case
    bf16_tflops: float
    fp8_tflops: float


# Order matters: the first substring that matches wins (so "mi325" before "mi300").
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("h200", 989.0, 1979.0),
    DevicePeak("h100", 989.0, 1979.0),  # SXM; the PCIe part is slower and not listed here
    DevicePeak("b200", 2250.0, 4500.0),
    DevicePeak("mi355", 2500.0, 5000.0),
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


def peak_tflops(device_name: str, precision: str, gcn_arch: str | None = None) -> tuple[float | None, float | None]:
    """(bf16 peak, the precision's own peak) in TFLOP/s; None where the device is unknown."""
    peak = find_peak(device_name, gcn_arch)
    if peak is None:
        return None, None
    own = peak.fp8_tflops if precision.startswith("fp8") else peak.bf16_tflops
    if precision == "fp32":
        own = None  # fp32 dense peaks are not in the table; report against bf16 only
    return peak.bf16_tflops, own


def fp8_dtype_names(vendor: str, device_name: str, gcn_arch: str | None = None) -> tuple[str, str]:
    """The float8 dtypes torchao picks (forward e4m3, gradients e5m2): the fnuz variants on MI300 (gfx942)."""
    arch = (gcn_arch or "").split(":")[0]
    if vendor == "amd" and (arch == "gfx942" or "mi300" in device_name.lower() or "mi325" in device_name.lower()):
        return "float8_e4m3fnuz", "float8_e5m2fnuz"
    return "float8_e4m3fn", "float8_e5m2"
