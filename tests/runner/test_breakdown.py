"""The step breakdown under real torchrun on CPU (gloo): profiled steps, categories, exposed communication.

Three runs of the debug shape (6 steps: 1 warm-up, 2 timed, 3 profiled): fp8-tensorwise at N=1 (emulated
float8), fp32 FSDP at N=2 and N=4. Tolerance (stated): a rank's categories add up to its profiled window
exactly (a partition, 1e-6 relative), and rank 0's step windows lie within the intervals the runner's own timer
measured for the same steps: within 10% of each after the first profiled step (measured here: within 1%). The first
profiled step's interval also holds the profiler's start, before its window (2-40 ms on an idle machine; with the
suite's workers and ranks sharing two cores, one run's three-step means differed by 53 ms, 247 against 300 ms), so
its window is only checked to lie within it.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics

import pytest

from core.analysis.breakdown import PARTITION, exposed_share, trace_file_name
from tests.runner.conftest import dump, launch, make_spec

pytestmark = pytest.mark.slow
STEPS = dict(steps=6, warmup_steps=1, profile_steps=3, local_batch_size=2)


# The trace's own intervals, swept here without core.analysis.breakdown's arithmetic: the rules are the module
# docstring's (a collective at any depth is communication; else the innermost operator is compute).
COLLECTIVE = ("gloo:", "c10d::", "_c10d_functional::", "c10d_functional::", "record_param_comms")


def _union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return out


def _length(iv):
    return sum(e - s for s, e in iv)


def _intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _track_segments(events):
    """(comm, compute) intervals of one thread: each instant belongs to the innermost event running then (the
    one that started last); it is communication when a collective runs at any depth there, compute when the
    innermost event is another operator (an annotation's own time is neither)."""
    bounds = sorted({e["ts"] for e in events} | {e["ts"] + e["dur"] for e in events})
    starts = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    comm, compute, active, i = [], [], [], 0
    for a, b in zip(bounds, bounds[1:]):
        active = [e for e in active if e["ts"] + e["dur"] > a]
        while i < len(starts) and starts[i]["ts"] <= a:
            if starts[i]["ts"] + starts[i]["dur"] > a:
                active.append(starts[i])
            i += 1
        if not active:
            continue
        inner = max(active, key=lambda e: (e["ts"], -e["dur"]))
        if any(e["name"].startswith(COLLECTIVE) for e in active):
            comm.append([a, b])
        elif inner.get("cat") == "cpu_op":
            compute.append([a, b])
    return comm, compute


def split_from_trace(path) -> tuple[float, float, float]:
    """(communication, exposed, overlapped) ms per profiled step of one rank, recomputed from its trace file."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in ev if re.fullmatch(r"scalebench\.step#\d+", e["name"])]
    lo, hi = min(s for s, _ in windows), max(e for _, e in windows)
    by_track: dict[tuple[object, object], list[dict]] = {}
    for e in ev:
        if e.get("cat") in ("cpu_op", "user_annotation") and e["ts"] < hi and e["ts"] + e["dur"] > lo:
            by_track.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    comm, compute = [], []
    for evs in by_track.values():
        c, p = _track_segments([e for e in evs if not re.fullmatch(r"scalebench\.step#\d+", e["name"])])
        comm += c
        compute += p
    comm, compute = _union(comm), _union(compute)
    out = []
    for s, e in windows:
        c = _intersect(comm, [[s, e]])
        over = _intersect(c, compute)
        out.append((_length(c) / 1000, (_length(c) - _length(over)) / 1000, _length(over) / 1000))
    return tuple(statistics.fmean(x[i] for x in out) for i in range(3))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple]:
    """N -> (result, run dir): fp8-tensorwise at N=1, fp32 FSDP at N=2 and N=4."""
    out = {}
    for n, precision in ((1, "fp8-tensorwise"), (2, "fp32"), (4, "fp32")):
        run_dir = tmp_path_factory.mktemp(f"n{n}")
        rc, result, err = launch(make_spec(precision, "fsdp", n, **STEPS), run_dir, nproc=n)
        assert rc == 0 and result.status == "succeeded", dump(result, err)
        out[n] = (result, run_dir)
    return out


def test_last_steps_profiled_on_every_rank_and_left_out_of_throughput(runs):
    for n, (result, run_dir) in runs.items():
        b = result.breakdown
        assert b.profiled_steps == [3, 4, 5]
        assert [r.rank for r in b.per_rank] == list(range(n))
        assert result.summary.num_timed_steps == 2  # steps 1 and 2: warm-up and profiled steps left out
        timed = [s.step_ms for s in result.steps[1:3]]
        assert result.summary.step_ms_median == pytest.approx(statistics.median(timed))
        for rank in range(n):  # each rank's trace kept, gzipped chrome-trace JSON with the step ranges
            with gzip.open(run_dir / trace_file_name(rank), "rt") as f:
                names = {e.get("name") for e in json.load(f)["traceEvents"]}
            assert {"scalebench.step#3", "scalebench.step#5"} <= names


def test_one_device_has_no_communication(runs):
    b = runs[1][0].breakdown.median
    assert b.communication_ms == 0 and b.exposed_communication_ms == 0 and b.overlapped_communication_ms == 0


def test_fsdp_communication_is_split_into_exposed_and_overlapped(runs):
    """Each rank's communication, exposed and overlapped ms recomputed from its own trace file (the intervals
    swept here, not by core.analysis.breakdown) and compared with what the runner reported. Whether the exposed
    share rises from N=2 to N=4 is a property of the machine (on two oversubscribed CPU cores it went either
    way), so it is not asserted."""
    for n in (2, 4):
        result, run_dir = runs[n]
        for r in result.breakdown.per_rank:
            comm, exposed, overlapped = split_from_trace(run_dir / trace_file_name(r.rank))
            assert comm > 0 and exposed > 0, (n, r.rank, comm, exposed)
            got = (r.communication_ms, r.exposed_communication_ms, r.overlapped_communication_ms)
            assert got == pytest.approx((comm, exposed, overlapped), rel=0.01, abs=0.05), (n, r.rank, got)
            assert r.exposed_communication_ms <= r.step_ms, r
        assert 0 < exposed_share(result.breakdown.median) <= 1, (n, result.breakdown.median)


def _windows_ms(path) -> dict[int, float]:
    """Each profiled step's window (its scalebench.step#k range) in ms, from one rank's trace file."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    marks = ((e, re.fullmatch(r"scalebench\.step#(\d+)", e.get("name", ""))) for e in events if e.get("ph") == "X")
    return {int(m[1]): e["dur"] / 1000 for e, m in marks if m}


def test_categories_add_up_to_the_measured_step_time(runs):
    for n, (result, run_dir) in runs.items():
        b = result.breakdown
        for r in b.per_rank:
            assert sum(getattr(r, k) for k in PARTITION) == pytest.approx(r.step_ms, rel=1e-6)
            # a rank's breakdown is the mean over its step windows
            windows = _windows_ms(run_dir / trace_file_name(r.rank))
            assert sorted(windows) == b.profiled_steps
            assert r.step_ms == pytest.approx(statistics.fmean(windows.values()), rel=1e-6)
        # rank 0's windows against rank 0's timer, which the result reports: a window opens after the previous
        # step's timer mark and closes just after its own, so it lies within the timed interval, give or take the
        # instant between the mark and the window's close. A rank descheduled in that instant (ranks and test
        # workers share two cores) closes it late by up to a scheduler slice: 2.3 ms was seen on a 105 ms step.
        # A window that held a second step or an evaluation would be longer by a whole step.
        windows = _windows_ms(run_dir / trace_file_name(0))
        for s in b.profiled_steps:
            timed = result.steps[s].step_ms
            assert windows[s] <= 1.01 * timed + 5.0, (n, s, windows[s], timed)
            if s != b.profiled_steps[0]:  # the first one's interval also holds the profiler's start
                assert windows[s] >= 0.9 * timed, (n, s, windows[s], timed)
        assert b.median.step_ms == pytest.approx(statistics.median(r.step_ms for r in b.per_rank), rel=1e-9)


def test_fp8_run_shows_casts_and_fp8_gemms_fp32_runs_none(runs):
    fp8 = runs[1][0].breakdown.median
    assert fp8.fp8_cast_ms > 0 and fp8.gemm_fp8_ms > 0
    assert fp8.gemm_bf16_ms > 0  # the output layer stays in high precision
    for n in (2, 4):
        b = runs[n][0].breakdown.median
        assert b.gemm_fp8_ms == 0 and b.fp8_cast_ms == 0 and b.gemm_bf16_ms > 0
        assert b.attention_ms > 0 and b.optimizer_ms > 0 and b.elementwise_ms > 0
