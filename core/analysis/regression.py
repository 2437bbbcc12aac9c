"""Nightly regression detection for one series point and one metric (pure; issue 7). No DB, no clock.

A pure state-machine step the scheduler calls once a night per (run key, cluster, metric):

    finding = evaluate(history, current, previous_state, config)

- baseline = median of the last K (default 7) successful values before tonight;
- noise sigma = 1.4826 * MAD (a robust standard deviation) of the last `noise_nights` (default 14)
  successful values: a MAD of 7 values is itself ~40% uncertain, and a too-small sigma is a false alarm;
- band = max(threshold * baseline, 3 * sigma) around the baseline (threshold default 5%, per metric);
- worse than the band: first night `suspected`, the next bad night `confirmed`; back inside: `recovered`;
  better than the band: `improved`; a point that used to succeed and now fails: `failed`.
- a metric with an absolute `limit` (the fp8-vs-bf16 loss gap; `numerics`, 1 when the fp8 loss verdict is
  `differs`) is bad when beyond it, history aside.

Each finding of a regression carries the environment diff between the last good and the first bad run,
the changed keys first: the likely cause.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

State = Literal["suspected", "confirmed", "recovered", "improved", "failed"]
OPEN_STATES = ("suspected", "confirmed", "failed")  # an open regression
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation

# Environment keys in the order a cause is most likely (Environment.model_dump() names); others follow.
ENV_KEYS = (
    "torch_version",
    "torchao_version",
    "driver_version",
    "cuda_version",
    "hip_version",
    "nccl_version",
    "hosts",
    "device_name",
    "gcn_arch",
    "device_count",
    "python_version",
    "backend",
    "fp8_dtypes",
)


@dataclass(frozen=True)
class MetricConfig:
    name: str  # tokens_per_sec, efficiency, fp8_speedup, peak_memory_allocated_gib, fp8_loss_gap, ...
    higher_is_better: bool = True
    threshold: float = 0.05  # relative to the baseline
    baseline_nights: int = 7  # K
    noise_nights: int = 14
    min_history: int = 5  # fewer successful nights: no baseline, no verdict on the value
    num_sigmas: float = 3.0
    limit: float | None = None  # absolute bound instead of a baseline (fp8_loss_gap)


DEFAULT_METRICS: dict[str, MetricConfig] = {
    "tokens_per_sec": MetricConfig("tokens_per_sec"),
    "efficiency": MetricConfig("efficiency"),
    "fp8_speedup": MetricConfig("fp8_speedup"),
    "mfu_vs_bf16_peak": MetricConfig("mfu_vs_bf16_peak"),
    "peak_memory_allocated_gib": MetricConfig("peak_memory_allocated_gib", higher_is_better=False),
    # |fp8 - bf16| / bf16 final loss; measured gaps on an H200 were within 1.2% (bench/results/2026-12-02-gpu-runner.md)
    "fp8_loss_gap": MetricConfig("fp8_loss_gap", higher_is_better=False, limit=0.03),
    # the fp8 loss verdict (core.analysis.numerics): 1 = differs (outside its noise band and the 1% tolerance),
    # 0 = tracks; a night that says differs is a regression of kind numerics, history aside
    "numerics": MetricConfig("numerics", higher_is_better=False, limit=0.5),
    # S(N) / steps_ratio (core.analysis.time_to_loss): the throughput speedup that survives fp8's per-step loss
    # penalty; nights where fp8 did not reach bf16's loss give no value
    "effective_speedup": MetricConfig("effective_speedup"),
}


@dataclass(frozen=True)
class NightlyValue:
    timestamp: datetime
    status: str  # succeeded | failed
    value: float | None  # None when failed
    run_id: str | int | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    # True for nights that were part of an open regression: they stay out of the baseline, so a lasting
    # drop is not silently absorbed after K nights (acknowledging/resolving it is the way to re-baseline).
    flagged: bool = False


class EnvChange(BaseModel):
    model_config = ConfigDict(frozen=True)
    key: str
    before: Any = None
    after: Any = None
    changed: bool


class EnvDiff(BaseModel):
    model_config = ConfigDict(frozen=True)
    good_run_id: str | None
    bad_run_id: str | None
    likely_cause: list[str]  # changed keys, most likely first
    changes: list[EnvChange]  # changed keys first, then the unchanged ones


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)
    metric: str
    state: State
    previous_state: str | None
    timestamp: datetime
    run_id: str | None
    value: float | None
    baseline: float | None = None
    band_low: float | None = None
    band_high: float | None = None
    sigma: float | None = None  # robust standard deviation of recent values
    relative_change: float | None = None  # value / baseline - 1
    limit: float | None = None
    message: str
    env_diff: EnvDiff | None = None


# --------------------------------------------------------------------------------------- statistics


def robust_sigma(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return MAD_TO_SIGMA * statistics.median(abs(v - med) for v in values)


@dataclass(frozen=True)
class Band:
    baseline: float
    sigma: float
    low: float
    high: float


def baseline_band(history: Sequence[NightlyValue], config: MetricConfig) -> Band | None:
    """Baseline and tolerance band from the successful, unflagged history; None when too short."""
    good = [h.value for h in history if h.status == "succeeded" and h.value is not None and not h.flagged]
    if len(good) < config.min_history:
        return None
    baseline = statistics.median(good[-config.baseline_nights :])
    sigma = robust_sigma(good[-config.noise_nights :])
    half = max(config.threshold * abs(baseline), config.num_sigmas * sigma)
    return Band(baseline=baseline, sigma=sigma, low=baseline - half, high=baseline + half)


def fp8_loss_gap(fp8_final_loss: float, bf16_final_loss: float) -> float:
    """|fp8 - bf16| / bf16 final loss, the value of the `fp8_loss_gap` metric."""
    if bf16_final_loss <= 0:
        raise ValueError(f"bf16_final_loss must be > 0, got {bf16_final_loss}")
    return abs(fp8_final_loss - bf16_final_loss) / bf16_final_loss


def numerics_value(verdict: str | None) -> float | None:
    """The `numerics` metric of an fp8 loss verdict: differs 1.0, tracks 0.0, inconclusive or none: no value."""
    return {"differs": 1.0, "tracks": 0.0}.get(verdict) if verdict else None


# ------------------------------------------------------------------------------------ environment diff


def _norm(value: Any) -> Any:
    return sorted(map(str, value)) if isinstance(value, (list, tuple, set)) else value


def environment_diff(good: NightlyValue | None, bad: NightlyValue) -> EnvDiff:
    """Every environment key of either run; the changed ones first (in ENV_KEYS order): the likely cause."""
    before = dict(good.environment) if good else {}
    after = dict(bad.environment)
    extra = sorted((before.keys() | after.keys()) - set(ENV_KEYS))
    keys = [k for k in ENV_KEYS if k in before or k in after] + extra
    # A key one run did not record (a failed command engine's run records no environment at all) is unknown, not
    # changed: only a value both runs recorded and that differs is a likely cause.
    changes = [
        EnvChange(
            key=k,
            before=before.get(k),
            after=after.get(k),
            changed=k in before and k in after and _norm(before[k]) != _norm(after[k]),
        )
        for k in keys
    ]
    changes.sort(key=lambda c: not c.changed)  # stable: keeps ENV_KEYS order within each group
    return EnvDiff(
        good_run_id=_id(good), bad_run_id=_id(bad), likely_cause=[c.key for c in changes if c.changed], changes=changes
    )


def _id(v: NightlyValue | None) -> str | None:
    return None if v is None or v.run_id is None else str(v.run_id)


def _last_good(history: Sequence[NightlyValue]) -> NightlyValue | None:
    good = [h for h in history if h.status == "succeeded" and h.value is not None and not h.flagged]
    return good[-1] if good else None


def _first_bad(history: Sequence[NightlyValue], current: NightlyValue, previous_state: str | None) -> NightlyValue:
    """The first night of the open regression: the trailing flagged nights, else tonight."""
    if previous_state not in OPEN_STATES:
        return current
    first = current
    for h in reversed(history):
        if not h.flagged:
            break
        first = h
    return first


# ---------------------------------------------------------------------------------------- evaluate


def _verdict(value: float, band: Band | None, config: MetricConfig) -> Literal["worse", "within", "better"]:
    if config.limit is not None:
        beyond = value < config.limit if config.higher_is_better else value > config.limit
        return "worse" if beyond else "within"
    assert band is not None
    if value < band.low:
        return "worse" if config.higher_is_better else "better"
    if value > band.high:
        return "better" if config.higher_is_better else "worse"
    return "within"


def _next_state(verdict: str, previous_state: str | None) -> State | None:
    is_open = previous_state in OPEN_STATES
    if verdict == "worse":
        return "confirmed" if previous_state in ("suspected", "confirmed") else "suspected"
    if verdict == "better":
        return "recovered" if is_open else "improved"
    return "recovered" if is_open else None


def _failure_finding(
    history: Sequence[NightlyValue], current: NightlyValue, previous_state: str | None, config: MetricConfig
) -> Finding | None:
    good = _last_good(history)
    if good is None:
        return None  # never succeeded: nothing regressed
    bad = _first_bad(history, current, previous_state)
    diff = environment_diff(good, bad)
    cause = f"; likely cause: {', '.join(diff.likely_cause)}" if diff.likely_cause else ""
    if not bad.environment:
        cause = "; the failed run recorded no environment to compare"
    return Finding(
        metric=config.name,
        state="failed",
        previous_state=previous_state,
        timestamp=current.timestamp,
        run_id=_id(current),
        value=None,
        env_diff=diff,
        message=f"{config.name} failed: the run failed after succeeding (last good run {_id(good)}){cause}",
    )


def evaluate(
    history: Sequence[NightlyValue], current: NightlyValue, previous_state: str | None, config: MetricConfig
) -> Finding | None:
    """One nightly step for one series point and metric; None when there is nothing to record.

    history: earlier nights (any order; later ones than `current` are ignored). previous_state: the state of
    the last finding of this point and metric (None, or a State); the caller stores it.
    """
    history = sorted((h for h in history if h.timestamp < current.timestamp), key=lambda h: h.timestamp)
    if current.status != "succeeded" or current.value is None:
        return _failure_finding(history, current, previous_state, config) if current.status == "failed" else None
    band = None if config.limit is not None else baseline_band(history, config)
    if band is None and config.limit is None:
        return None  # too little history for a baseline
    state = _next_state(_verdict(current.value, band, config), previous_state)
    if state is None:
        return None
    diff = (
        environment_diff(_last_good(history), _first_bad(history, current, previous_state))
        if state in OPEN_STATES
        else None
    )
    return _finding(state, current, previous_state, band, config, diff)


def _finding(
    state: State,
    current: NightlyValue,
    previous_state: str | None,
    band: Band | None,
    config: MetricConfig,
    diff: EnvDiff | None,
) -> Finding:
    value = current.value
    assert value is not None
    rel = value / band.baseline - 1 if band and band.baseline else None
    if band is not None:
        where = f"{rel:+.1%} vs baseline {band.baseline:.6g} (band {band.low:.6g}..{band.high:.6g})"
    else:
        where = f"limit {config.limit:.6g}"
    cause = f"; likely cause: {', '.join(diff.likely_cause)}" if diff and diff.likely_cause else ""
    return Finding(
        metric=config.name,
        state=state,
        previous_state=previous_state,
        timestamp=current.timestamp,
        run_id=_id(current),
        value=value,
        baseline=band.baseline if band else None,
        band_low=band.low if band else None,
        band_high=band.high if band else None,
        sigma=band.sigma if band else None,
        relative_change=rel,
        limit=config.limit,
        message=f"{config.name} {state}: {value:.6g}, {where}{cause}",
        env_diff=diff,
    )


def replay(nights: Sequence[NightlyValue], config: MetricConfig) -> list[Finding | None]:
    """The nightly loop over one point's nights in order, as the scheduler runs it: each night evaluated against
    the earlier ones, the state carried, the nights of an open regression flagged (kept out of the baseline).
    For replaying a recorded or simulated history under another threshold."""
    history: list[NightlyValue] = []
    state: str | None = None
    findings: list[Finding | None] = []
    for cur in nights:
        f = evaluate(history, cur, state, config)
        state = f.state if f else state
        findings.append(f)
        history.append(replace(cur, flagged=bool(f and f.state in OPEN_STATES)))
    return findings
