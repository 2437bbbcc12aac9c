"""Step timing, loss bookkeeping without per-step host syncs (the Summary arithmetic lives in core.analysis.summary).

Definitions (docs/architecture.md): tokens/s per device = global tokens per step / step time / N; TFLOP/s per device
= FLOPs/token * that; MFU = TFLOP/s per device / peak dense TFLOP/s (bf16 peak, and the precision's own).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

GIB = 1024**3


class StepTimer:
    """Per-step wall time. CUDA: events recorded on the stream, read once at the end (no sync per step).
    CPU: every op has finished when it returns (execution is synchronous), so the host clock is exact."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        """Call before the first step and after every step."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        """Milliseconds of each completed step. CUDA: CPU-GPU sync point (waits for the last event)."""
        if len(self._marks) < 2:
            return []
        if self.cuda:
            self._marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self._marks, self._marks[1:])]
        return [(b - a) * 1000.0 for a, b in zip(self._marks, self._marks[1:])]


class DeviceLog:
    """Per-step scalars kept as 0-d device tensors; one stack + all-reduce when read (not every step)."""

    def __init__(self, holds_loss: bool = True):
        # False on a pipeline stage before the last: its losses are 0 placeholders, read only through the reduce.
        self.holds_loss = holds_loss
        self.losses: list[torch.Tensor] = []
        self.grad_norms: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.losses.append(loss.detach().float())
        self.grad_norms.append(grad_norm.detach().float())

    def read(self, reduce: bool, holders: int | None = None) -> tuple[list[float], list[float]]:
        """(losses averaged over the ranks that hold one, grad norms). reduce=False after a communication failure
        (each rank's own). holders: how many ranks hold a loss, all by default; under pipeline parallelism those
        of the last stage (the others add 0)."""
        if not self.losses:
            return [], []
        losses = torch.stack(self.losses)
        if reduce and dist.is_initialized() and dist.get_world_size() > 1:
            # Mean over the holders = mean over DP ranks (TP ranks of a DP group hold the same loss).
            dist.all_reduce(losses, op=dist.ReduceOp.SUM)
            losses = losses / (holders or dist.get_world_size())
        elif not self.holds_loss:
            losses = losses[:0]  # a stage without the loss reports none (not zeros)
        norms = torch.stack(self.grad_norms)
        return losses.cpu().tolist(), norms.cpu().tolist()  # CPU-GPU sync point (once)


def peak_memory_gib(device: torch.device, reduce: bool = True) -> tuple[float | None, float | None]:
    """(allocated, reserved) peak GiB, max over ranks; (None, None) on CPU (no allocator statistics)."""
    if device.type != "cuda":
        return None, None
    mem = torch.tensor(
        [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
        dtype=torch.float64,
        device=device,
    )
    if reduce and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
    alloc, reserved = (mem / GIB).tolist()
    return alloc, reserved


def memory_at_failure(device: torch.device) -> dict[str, float] | None:
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
        "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
        "max_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "free_gib": free / GIB,
        "total_gib": total / GIB,
    }
