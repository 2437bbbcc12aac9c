"""Environment capture into core.contracts.specs.Environment.

The decisions (vendor, device name, arch, fp8 dtypes, peaks) are pure functions of a small DeviceInfo, so
tests cover the AMD and NVIDIA branches with simulated properties; `probe_device()` fills it from torch.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Literal

import torch

from core.catalog.hardware import fp8_dtype_names, peak_tflops
from core.contracts.specs import Environment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceInfo:
    """What torch reports about the device (or a test's stand-in)."""

    vendor: Literal["nvidia", "amd", "cpu"]
    device_name: str
    device_count: int
    gcn_arch: str | None = None  # AMD: gcnArchName, e.g. "gfx942:sramecc+:xnack-"
    cuda_version: str | None = None
    hip_version: str | None = None


def vendor_of(
    hip_version: str | None, cuda_version: str | None, cuda_available: bool
) -> Literal["nvidia", "amd", "cpu"]:
    """torch.version.hip set -> amd (ROCm builds also answer to torch.cuda); cuda -> nvidia; else cpu."""
    if not cuda_available:
        return "cpu"
    if hip_version:
        return "amd"
    return "nvidia" if cuda_version else "cpu"


def device_info_from(
    props, *, device_count: int, hip_version: str | None, cuda_version: str | None, cuda_available: bool = True
) -> DeviceInfo:
    """DeviceInfo from a torch.cuda.get_device_properties()-like object (attributes name, gcnArchName)."""
    vendor = vendor_of(hip_version, cuda_version, cuda_available)
    if vendor == "cpu":
        return DeviceInfo("cpu", platform.processor() or platform.machine() or "cpu", 1)
    gcn = getattr(props, "gcnArchName", None) if vendor == "amd" else None
    return DeviceInfo(
        vendor,
        props.name,
        device_count,
        gcn_arch=gcn or None,
        cuda_version=cuda_version if vendor == "nvidia" else None,
        hip_version=hip_version if vendor == "amd" else None,
    )


def probe_device(device_type: str) -> DeviceInfo:
    if device_type != "cuda" or not torch.cuda.is_available():
        return device_info_from(None, device_count=1, hip_version=None, cuda_version=None, cuda_available=False)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return device_info_from(
        props, device_count=torch.cuda.device_count(), hip_version=torch.version.hip, cuda_version=torch.version.cuda
    )


def expected_fp8_dtypes(info: DeviceInfo) -> list[str]:
    """What torchao should pick on this device (e4m3fn/e5m2; the fnuz variants on MI300/MI325)."""
    return list(fp8_dtype_names(info.vendor, info.device_name, info.gcn_arch))


def peaks_for(info: DeviceInfo, precision: str) -> tuple[float | None, float | None, str | None]:
    """(bf16 peak, precision's own peak, note when MFU cannot be given)."""
    if info.vendor == "cpu":
        return None, None, "no peak TFLOP/s for CPU devices: MFU not reported"
    bf16, own = peak_tflops(info.device_name, precision, info.gcn_arch)
    if bf16 is None:
        return None, None, f"device {info.device_name!r} ({info.gcn_arch or 'no gcn arch'}) is not in the peak table"
    note = None if own is not None else f"no {precision} peak in the table: MFU against bf16 only"
    return bf16, own, note


def driver_version(vendor: str) -> str | None:
    """nvidia-smi / rocm-smi if on PATH, else pynvml; None when neither answers."""
    cmd = {
        "nvidia": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        "amd": ["rocm-smi", "--showdriverversion", "--csv"],
    }.get(vendor)
    if cmd and shutil.which(cmd[0]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                return out[-1].split(",")[-1].strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    if vendor == "nvidia":
        try:
            import pynvml

            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:  # noqa: BLE001 - pynvml absent or no driver: the field stays None
            return None
    return None


def nccl_version(vendor: str) -> str | None:
    if vendor == "cpu":
        return None
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - an optional probe: no value, no failure
        return None


def torchao_version() -> str | None:
    """The installed torchao's version, read from its package metadata: importing torchao costs a rank ~1 s of
    start-up, which a bf16 or fp32 run does not otherwise pay."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def capture_environment(
    info: DeviceInfo,
    *,
    hosts: list[str],
    world_size: int,
    backend: str | None,
    fp8_dtypes: list[str],
    engine: str = "scalebench",
    torchtitan_version: str | None = None,
) -> Environment:
    return Environment(
        vendor=info.vendor,
        device_name=info.device_name,
        device_count=info.device_count,
        gcn_arch=info.gcn_arch,
        driver_version=driver_version(info.vendor),
        cuda_version=info.cuda_version,
        hip_version=info.hip_version,
        torch_version=torch.__version__,
        torchao_version=torchao_version(),
        nccl_version=nccl_version(info.vendor),
        python_version=platform.python_version(),
        hosts=hosts,
        world_size=world_size,
        backend=backend,
        fp8_dtypes=fp8_dtypes,
        engine=engine,
        torchtitan_version=torchtitan_version,
    )


def gather_hosts(world_size: int) -> list[str]:
    """Sorted unique hostnames of all ranks (one all_gather_object; collective: every rank calls it)."""
    import torch.distributed as dist

    name = socket.gethostname()
    if not dist.is_initialized() or world_size == 1:
        return [name]
    names: list[str | None] = [None] * world_size
    dist.all_gather_object(names, name)
    return sorted({n for n in names if n})
