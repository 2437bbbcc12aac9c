"""torch.profiler over the last `profile_steps` steps of a run, on every rank, and the step breakdown.

The profiled steps are the run's last ones: a profiled step is slower (the profiler records every op), and
stopping the profiler takes seconds, so no unprofiled step comes after them; train.py leaves them out of the
throughput figures. Each rank keeps its trace gzipped beside result.json (core.analysis.breakdown.TRACE_FILE),
computes its own breakdown from it (core.analysis.breakdown: the rules), and rank 0 gathers them all.

    profiler = StepProfiler(spec, device, trace_dir)
    for step in ...:
        profiler.begin(step)  # the first profiled step starts the profiler; each profiled step is a range
        ...train step...; timer.mark()
        profiler.end(step)    # after the last profiled step: a marker kernel (GPU), then the profiler stops
    breakdown = profiler.finish()  # collective: every rank, after the loop
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from core.analysis.breakdown import (
    END_MARK,
    STEP_MARK,
    Breakdown,
    RankBreakdown,
    median_over_ranks,
    rank_breakdown,
    timeline_from_chrome_trace,
    trace_file_name,
)
from core.contracts.specs import RunSpec

log = logging.getLogger(__name__)


def read_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def breakdown_of_trace(trace: dict, rank: int) -> RankBreakdown:
    events, windows, timeline = timeline_from_chrome_trace(trace)
    log.info("breakdown of rank %d: %d %s events in %d step windows", rank, len(events), timeline, len(windows))
    return rank_breakdown(rank, events, windows)


class StepProfiler:
    """Profiles steps [first, steps) of a run; a no-op when spec.profile_steps is 0."""

    def __init__(self, spec: RunSpec, device: torch.device, trace_dir: Path | None):
        self.device, self.trace_dir = device, trace_dir
        self.first = spec.steps - spec.profile_steps  # == spec.steps: nothing profiled
        self.last = spec.steps - 1
        self._prof: profile | None = None
        self._range: record_function | None = None

    @property
    def profiled_steps(self) -> list[int]:
        return list(range(self.first, self.last + 1))

    def begin(self, step: int) -> None:
        if step < self.first:
            return
        if step == self.first:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)  # HIP kernels too on ROCm
            self._prof = profile(activities=activities)
            self._prof.start()
        self._range = record_function(f"{STEP_MARK}{step}")
        self._range.__enter__()

    def end(self, step: int) -> None:
        if step < self.first or self._range is None:
            return
        self._range.__exit__(None, None, None)
        self._range = None
        if step == self.last:
            if self.device.type == "cuda":
                # One tiny kernel queued after the last step: its start on the device ends that step's window.
                with record_function(END_MARK):
                    torch.zeros(1, device=self.device)
            if self._prof is not None:  # started at the first profiled step
                self._prof.stop()  # CPU-GPU sync point; processes the events (seconds for a large model)

    def finish(self) -> Breakdown | None:
        """Write this rank's trace, compute its breakdown, gather all ranks' (collective). None when off."""
        if self._prof is None:
            return None
        t0 = time.monotonic()
        rank = dist.get_rank() if dist.is_initialized() else 0
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            self._prof.export_chrome_trace(str(raw))
            trace = json.loads(raw.read_text())
            if self.trace_dir is not None:
                path = self.trace_dir / trace_file_name(rank)
                partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                with raw.open("rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(partial, path)
        mine = breakdown_of_trace(trace, rank)
        del trace
        self._prof = None
        per_rank: list = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            per_rank = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, mine.model_dump())
            per_rank = [RankBreakdown.model_validate(r) for r in per_rank]
        log.info(
            "profiled steps %d-%d: rank %d step %.1f ms, exposed communication %.1f ms (trace and breakdown in %.1f s)",
            self.first,
            self.last,
            rank,
            mine.step_ms,
            mine.exposed_communication_ms,
            time.monotonic() - t0,
        )
        return Breakdown(profiled_steps=self.profiled_steps, per_rank=per_rank, median=median_over_ranks(per_rank))
