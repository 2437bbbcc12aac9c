"""Where a training step's time goes: the category rules and the interval arithmetic, over profiler events.

Pure (stdlib + pydantic): the runner (runner.profiling) turns a torch.profiler trace into `Event`s and step
windows with `timeline_from_chrome_trace`; `rank_breakdown` does the rest. The rules were read off real
traces: the CPU timeline under gloo (torchao emulated float8) and H200 kernel names (bench/profile_fp8.py).

The device timeline of one rank: its GPU's streams (kernels, memcpy, memset), or on CPU its threads (the main
thread runs the ops; gloo runs collectives on its own threads). At every instant of a step window:
- the innermost running event of each track has a category (`category` over its name and the names that
  enclose it: the enclosing CPU ops, or for a kernel the CPU ops that launched it); an annotation's own
  time (record_function ranges such as FSDP::all_gather, where the host waits or runs Python) is no work;
- compute running on any track: the instant goes to the compute categories running (split evenly when
  several tracks compute at once); else communication running: exposed communication; else idle.
On CPU the host is the device: idle is mostly the interpreter and dispatch between ops, and a rank blocked on
a collective (FSDP waiting for its all-gather) shows as exposed communication.
So per step (ms):
    step_ms = gemm_bf16 + gemm_fp8 + fp8_cast + attention + elementwise + optimizer + exposed_comm + idle
    communication_ms = exposed_communication_ms + overlapped_communication_ms   (time any collective runs)
Every category is a mean over the profiled steps; the median over ranks is taken category by category (so
its parts need not add up to its step_ms exactly; each rank's do).
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from core.contracts.base import Strict

# Compute categories (a share of the step each) and communication.
GEMM_BF16, GEMM_FP8, FP8_CAST, ATTENTION, ELEMENTWISE, OPTIMIZER = (
    "gemm_bf16_ms",
    "gemm_fp8_ms",
    "fp8_cast_ms",
    "attention_ms",
    "elementwise_ms",
    "optimizer_ms",
)
COMMUNICATION = "communication_ms"
COMPUTE_CATEGORIES = (GEMM_BF16, GEMM_FP8, FP8_CAST, ATTENTION, ELEMENTWISE, OPTIMIZER)
# What one step is made of: these add up to step_ms.
PARTITION = (*COMPUTE_CATEGORIES, "exposed_communication_ms", "idle_ms")
# Every figure of a step breakdown, in the order tables show them.
CATEGORY_KEYS = (
    "step_ms",
    *COMPUTE_CATEGORIES,
    COMMUNICATION,
    "idle_ms",
    "exposed_communication_ms",
    "overlapped_communication_ms",
)

STEP_MARK = "scalebench.step#"  # record_function range around each profiled step: "scalebench.step#12"
END_MARK = "scalebench.profile_end"  # a range with one tiny kernel after the last profiled step (GPU)
TRACE_FILE = "trace.rank{rank}.json.gz"  # per rank, beside result.json in the run directory


def trace_file_name(rank: int) -> str:
    return TRACE_FILE.format(rank=rank)


# ------------------------------------------------------------------------------------------- results


class StepBreakdown(Strict):
    """Milliseconds per step by category (module docstring: what adds up to what)."""

    step_ms: float
    gemm_bf16_ms: float  # high-precision GEMMs (bf16; fp32 in fp32 runs)
    gemm_fp8_ms: float  # scaled-mm GEMMs; on CPU torchao's emulated float8 GEMMs
    fp8_cast_ms: float  # float8 amax, scale and cast (with whatever a compiler fused into those kernels)
    attention_ms: float
    elementwise_ms: float  # norms, RoPE, SwiGLU, loss, copies, memsets: every other compute
    optimizer_ms: float  # AdamW and gradient clipping
    communication_ms: float  # any collective running (NCCL/RCCL kernels; gloo ops on CPU)
    idle_ms: float  # neither compute nor communication on the device
    exposed_communication_ms: float  # collectives running while no compute runs
    overlapped_communication_ms: float  # collectives running under compute


class RankBreakdown(StepBreakdown):
    rank: int


class Breakdown(Strict):
    """RunResult.breakdown: which steps were profiled, each rank's breakdown, and the median over ranks."""

    profiled_steps: list[int]
    per_rank: list[RankBreakdown]
    median: StepBreakdown


def median_over_ranks(per_rank: Sequence[StepBreakdown]) -> StepBreakdown:
    return StepBreakdown(**{k: statistics.median(getattr(r, k) for r in per_rank) for k in CATEGORY_KEYS})


def exposed_share(b: StepBreakdown) -> float | None:
    """Exposed communication as a fraction of the step."""
    return b.exposed_communication_ms / b.step_ms if b.step_ms > 0 else None


# ------------------------------------------------------------------------------- along N, per series


class BreakdownPoint(StepBreakdown):
    """One series at one N: each category the median over the runs (repeats) of their median over ranks."""

    num_devices: int
    num_runs: int
    run_ids: list[int]
    exposed_communication_share: float | None  # exposed_communication_ms / step_ms, a fraction


class BreakdownSeries(Strict):
    precision: str
    layout: str
    points: list[BreakdownPoint]


class ExperimentBreakdown(Strict):
    experiment_id: int
    categories: list[str] = list(CATEGORY_KEYS)  # every figure of a point, ms per step
    partition: list[str] = list(PARTITION)  # the parts of a step: they add up to step_ms
    series: list[BreakdownSeries]  # empty when no run was profiled (profile_steps 0)


def experiment_breakdown(
    experiment_id: int, runs: Iterable[tuple[int, str, str, int, Breakdown]]
) -> ExperimentBreakdown:
    """Series (precision x layout) of (run id, precision, layout, N, breakdown) rows, points by N."""
    groups: dict[tuple[str, str], dict[int, list[tuple[int, Breakdown]]]] = defaultdict(lambda: defaultdict(list))
    for run_id, precision, layout, n, b in runs:
        groups[(precision, layout)][n].append((run_id, b))
    series = []
    for (precision, layout), by_n in sorted(groups.items()):
        points = []
        for n, rs in sorted(by_n.items()):
            median = median_over_ranks([b.median for _, b in rs])
            points.append(
                BreakdownPoint(
                    num_devices=n,
                    num_runs=len(rs),
                    run_ids=[i for i, _ in rs],
                    exposed_communication_share=exposed_share(median),
                    **median.model_dump(),
                )
            )
        series.append(BreakdownSeries(precision=precision, layout=layout, points=points))
    return ExperimentBreakdown(experiment_id=experiment_id, series=series)


CSV_COLUMNS = ("precision", "layout", "num_devices", "num_runs", *CATEGORY_KEYS, "exposed_communication_share")


def breakdown_csv(report: ExperimentBreakdown) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for s in report.series:
        for p in s.points:
            writer.writerow({"precision": s.precision, "layout": s.layout, **p.model_dump()})
    return buf.getvalue()


# --------------------------------------------------------------------------------------------- rules

_COMM_PREFIXES = ("gloo:", "c10d::", "_c10d_functional::", "c10d_functional::", "record_param_comms")
_GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_scaled_mm",
        "aten::_scaled_grouped_mm",
        "aten::mv",
        "aten::addmv",
        "aten::matmul",
        "aten::linear",
        "aten::_addmm_activation",
        "aten::_int_mm",
    }
)
_GEMM_KERNEL = ("gemm", "cutlass", "xmma", "nvjet", "cublas", "hipblaslt", "cijk_", "_mm_kernel")
_FP8_GEMM_KERNEL = re.compile(r"nvjet_sm\d+_q|e4m3|e5m2|f8f8|fp8|float8")
_ATTENTION = ("flash", "fmha", "attention", "sdpa", "scaled_dot_product")
_OPTIMIZER = ("optimizer.", "adam", "foreach_norm", "lpnorm", "foreach_mul_", "multi_tensor_apply", "clip_grad")
_CAST = ("amax", "abs_max", "_scaled_mm", "float8", "fp8", "e4m3", "e5m2")


def is_communication(name: str) -> bool:
    n = name.lower()
    return n.startswith(_COMM_PREFIXES) or "nccl" in n or "rccl" in n


def _is_triton_fused(n: str) -> bool:
    """Inductor's fused kernels are named after the ops they fuse (triton_poi_fused_abs_amax_...)."""
    return n.startswith("triton_") and not n.startswith("triton_tem")


def _has_cast(n: str) -> bool:
    return any(s in n for s in _CAST) or ("clamp" in n and "reciprocal" in n)


def _gemm_at(names: Sequence[str]) -> int | None:
    """Index of the outermost GEMM in the stack (an aten GEMM op, or a GEMM kernel as the innermost name)."""
    for i, n in enumerate(names):
        if n in _GEMM_OPS:
            return i
    leaf = names[-1]
    if not _is_triton_fused(leaf) and (any(s in leaf for s in _GEMM_KERNEL) or leaf.startswith("triton_tem")):
        return len(names) - 1
    return None


def category(stack: Sequence[str]) -> str:
    """The category of the innermost of `stack` (names outermost first; for a kernel, the CPU ops that
    launched it, then the kernel). First rule that matches:

    1. communication: a collective anywhere in the stack (gloo:*, c10d::*, _c10d_functional::*, NCCL/RCCL);
    2. FSDP's copy-in/copy-out (fsdp::*): elementwise (copies around the collectives, not the collectives);
    3. optimizer: Optimizer.step/zero_grad ranges, AdamW, foreach norm/mul of gradient clipping;
    4. a compiler-fused kernel (triton_*): fp8 cast when it fuses an amax, scale or float8 cast, else
       attention or elementwise by its name;
    5. attention: SDPA / flash / fmha ops and kernels;
    6. GEMM: an aten GEMM op (and every op inside it) or a GEMM kernel: fp8 when it is a scaled mm or an
       fp8 kernel (cuBLASLt nvjet_smXX_q*, e4m3/e5m2), or a GEMM on torchao float8 tensors (an aten::mm
       that dispatches to a Python subclass inside a float8 scope: the CPU emulation); else bf16;
    7. fp8 cast: anything else inside a torchao float8 scope (amax, scale, cast to float8), or named so;
    8. elementwise: the rest.
    """
    names = [n.lower() for n in stack]
    leaf = names[-1]
    if any(is_communication(n) for n in names):
        return COMMUNICATION
    if any(n.startswith("fsdp::") for n in names):
        return ELEMENTWISE
    if any(s in n for n in names for s in _OPTIMIZER):
        return OPTIMIZER
    if _is_triton_fused(leaf):
        if _has_cast(leaf):
            return FP8_CAST
        return ATTENTION if any(s in leaf for s in _ATTENTION) else ELEMENTWISE
    if any(s in n for n in names for s in _ATTENTION):
        return ATTENTION
    g = _gemm_at(names)
    if g is not None:
        inner = names[g:]
        fp8 = (
            any("_scaled_mm" in n for n in inner)
            or bool(_FP8_GEMM_KERNEL.search(leaf))
            or ("pythonsubclass" in inner and any("float8" in n for n in names[:g]))
        )
        return GEMM_FP8 if fp8 else GEMM_BF16
    if any("float8" in n for n in names) or _has_cast(leaf):
        return FP8_CAST
    return ELEMENTWISE


# ------------------------------------------------------------------------------------------ intervals


@dataclass(frozen=True, slots=True)
class Event:
    """One profiler event of a rank. `track`: its thread (CPU) or stream (GPU). `work`: an operator or a
    kernel; False for an annotation range, whose own time is no work but whose name classifies what runs
    inside it. `context`: names that enclose it on another timeline (a kernel: the CPU ops that launched it)."""

    name: str
    start_us: float
    end_us: float
    track: str
    work: bool = True
    context: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Window:
    step: int
    start_us: float
    end_us: float


def track_pieces(events: Iterable[Event]) -> list[tuple[float, float, str]]:
    """(start, end, category) of one track: each instant belongs to the innermost event running then.
    Children are clipped to their parent (profiler timestamps of nested ops can overrun by a microsecond);
    an annotation's own time and gaps give no piece."""
    pieces: list[tuple[float, float, str]] = []
    stack: list[tuple[float, str | None, tuple[str, ...]]] = []  # (end, category of own time, names)
    t = 0.0

    def emit(until: float) -> None:
        nonlocal t
        if stack and until > t and stack[-1][1] is not None:
            pieces.append((t, until, stack[-1][1]))
        t = max(t, until)

    for e in sorted(events, key=lambda e: (e.start_us, -e.end_us)):
        while stack and stack[-1][0] <= e.start_us:
            emit(stack[-1][0])
            stack.pop()
        if stack:
            emit(e.start_us)
        t = e.start_us
        names = (stack[-1][2] if stack else e.context) + (e.name,)
        end = min(e.end_us, stack[-1][0]) if stack else e.end_us
        stack.append((end, category(names) if e.work else None, names))
    while stack:
        emit(stack[-1][0])
        stack.pop()
    return pieces


def window_breakdown(pieces: Sequence[tuple[float, float, str]], window: Window) -> dict[str, float]:
    """Milliseconds of one window by category, from the pieces of every track of the device."""
    edges: list[tuple[float, int, str]] = []
    for start, end, cat in pieces:
        s, e = max(start, window.start_us), min(end, window.end_us)
        if e > s:
            edges += [(s, 1, cat), (e, -1, cat)]
    edges.sort(key=lambda x: (x[0], x[1]))
    us: dict[str, float] = defaultdict(float)
    running: dict[str, int] = defaultdict(int)
    t = window.start_us
    for when, delta, cat in [*edges, (window.end_us, 0, "")]:
        dt = when - t
        if dt > 0:
            computing = sum(running[c] for c in COMPUTE_CATEGORIES)
            if computing:
                for c in COMPUTE_CATEGORIES:
                    us[c] += dt * running[c] / computing
            elif running[COMMUNICATION]:
                us["exposed_communication_ms"] += dt
            else:
                us["idle_ms"] += dt
            if running[COMMUNICATION]:
                us[COMMUNICATION] += dt
        t = max(t, when)
        if cat:
            running[cat] += delta
    out = {k: us[k] / 1000.0 for k in CATEGORY_KEYS if k != "step_ms"}
    out["step_ms"] = (window.end_us - window.start_us) / 1000.0
    out["overlapped_communication_ms"] = out[COMMUNICATION] - out["exposed_communication_ms"]
    return out


def rank_breakdown(rank: int, events: Sequence[Event], windows: Sequence[Window]) -> RankBreakdown:
    """One rank's breakdown: the mean over its step windows, in ms per step."""
    if not windows:
        raise ValueError("no step window in the trace: the profiled steps were not marked")
    by_track: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_track[e.track].append(e)
    pieces = [p for evs in by_track.values() for p in track_pieces(evs)]
    per_step = [window_breakdown(pieces, w) for w in windows]
    return RankBreakdown(rank=rank, **{k: statistics.fmean(s[k] for s in per_step) for k in CATEGORY_KEYS})


# ------------------------------------------------------------------------------------ chrome trace


_STEP_RE = re.compile(re.escape(STEP_MARK) + r"(\d+)$")
_CPU_CATS = ("cpu_op", "user_annotation", "python_function")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")


def _complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _cpu_stacks(cpu: list[dict[str, Any]]) -> dict[int, tuple[str, ...]]:
    """External id of each CPU event -> the names enclosing it on its thread, itself last."""
    out: dict[int, tuple[str, ...]] = {}
    by_tid: dict[object, list[dict[str, Any]]] = defaultdict(list)
    for e in cpu:
        by_tid[e.get("tid")].append(e)
    for evs in by_tid.values():
        stack: list[tuple[float, tuple[str, ...]]] = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1][0] <= e["ts"]:
                stack.pop()
            names = (stack[-1][1] if stack else ()) + (e["name"],)
            stack.append((e["ts"] + e["dur"], names))
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                out[ext] = names
    return out


def _step_of(ts: float, windows: Sequence[Window]) -> int | None:
    for w in windows:
        if w.start_us <= ts <= w.end_us:
            return w.step
    return None


def timeline_from_chrome_trace(trace: dict[str, Any]) -> tuple[list[Event], list[Window], str]:
    """(events of the rank's device timeline, step windows on it, "gpu" | "cpu") from a torch.profiler
    chrome trace whose profiled steps are marked with STEP_MARK ranges.

    GPU: the kernels, memcpys and memsets of the busiest device; each carries the CPU ops that launched it
    (runtime call -> correlation id). Step k's window runs from its first kernel's start to the next step's
    first kernel (after the last step: the END_MARK kernel, else the last kernel's end).
    CPU: every CPU op and annotation; windows are the STEP_MARK ranges themselves.
    """
    xs = _complete_events(trace)
    cpu = [e for e in xs if e.get("cat") in _CPU_CATS]
    cpu_windows = sorted(
        (Window(int(m.group(1)), e["ts"], e["ts"] + e["dur"]) for e in cpu if (m := _STEP_RE.match(e["name"]))),
        key=lambda w: w.start_us,
    )
    device = [e for e in xs if e.get("cat") in _DEVICE_CATS]
    if not device:
        events = [
            Event(
                e["name"],
                e["ts"],
                e["ts"] + e["dur"],
                f"cpu:{e.get('pid')}:{e.get('tid')}",
                work=e.get("cat") == "cpu_op" or is_communication(e["name"]),
            )
            for e in cpu
            if not _STEP_RE.match(e["name"])
        ]
        return events, cpu_windows, "cpu"
    return _gpu_timeline(xs, cpu, device, cpu_windows)


def _gpu_timeline(
    xs: list[dict[str, Any]], cpu: list[dict[str, Any]], device: list[dict[str, Any]], cpu_windows: list[Window]
) -> tuple[list[Event], list[Window], str]:
    counts: dict[object, int] = defaultdict(int)
    for e in device:
        counts[(e.get("args") or {}).get("device", e.get("pid"))] += 1
    dev = max(counts, key=counts.__getitem__)
    device = [e for e in device if (e.get("args") or {}).get("device", e.get("pid")) == dev]
    stacks = _cpu_stacks(cpu)
    launches = {(e.get("args") or {}).get("correlation"): e for e in xs if e.get("cat") in _RUNTIME_CATS}
    end_mark = max((e["ts"] for e in cpu if e["name"] == END_MARK), default=None)
    events: list[Event] = []
    first_start: dict[int, float] = {}
    last_end = 0.0
    end_start = None
    for e in device:
        args = e.get("args") or {}
        launch = launches.get(args.get("correlation"))
        launch_ts = launch["ts"] if launch else e["ts"]
        ext = (launch.get("args") or {}).get("External id") if launch else args.get("External id")
        context = stacks.get(ext, ()) if ext is not None else ()
        start, end = e["ts"], e["ts"] + e["dur"]
        if end_mark is not None and launch_ts >= end_mark:
            end_start = start if end_start is None else min(end_start, start)
            continue
        step = _step_of(launch_ts, cpu_windows)
        if step is None:
            continue  # launched outside the profiled steps
        first_start[step] = min(first_start.get(step, start), start)
        last_end = max(last_end, end)
        events.append(
            Event(e["name"], start, end, f"gpu{dev}:stream{args.get('stream', e.get('tid'))}", context=context)
        )
    steps = sorted(first_start)
    bounds = [first_start[s] for s in steps] + [end_start if end_start is not None else last_end]
    windows = [Window(s, bounds[i], max(bounds[i], bounds[i + 1])) for i, s in enumerate(steps)]
    return events, windows, "gpu"
