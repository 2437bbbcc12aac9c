"""A plan's options at equal loss (pure): time and GPU-hours for fp8 to reach the loss bf16 reaches with the
token budget, from the measured time to loss (core.analysis.time_to_loss).

bf16 trained on T tokens reaches some loss L; fp8 reaches L after steps_ratio x T tokens (steps_ratio: fp8 steps
/ bf16 steps to the same loss, measured at the end of the runs). So an fp8 option's time at equal loss is
steps_ratio x T / X_fp8(N), and its GPU-hours N times that; a bf16 option's is its time to train. The ratio is
a property of the recipe, model and data rather than of N: the option uses the ratio measured at its own N,
else the median over the series' measured Ns (said in its note). No ratio measured (fp8 never reached bf16's
loss, or no curves): no time at equal loss.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from core.analysis.scaling import ScalingReport


def steps_ratios(measured: ScalingReport) -> dict[tuple[str, str, str], dict[int, float]]:
    """(engine, fp8 precision, layout) -> N -> steps_ratio, from the report's speedups."""
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for sp in measured.speedups:
        if sp.steps_ratio is not None:
            out.setdefault((sp.engine, sp.precision, sp.layout), {})[sp.num_devices] = sp.steps_ratio
    return out


def ratio_for(
    ratios: Mapping[tuple[str, str, str], Mapping[int, float]], engine: str, precision: str, layout: str, n: int
) -> tuple[float | None, str | None]:
    """(steps_ratio for an option, a note when it is not measured at its N); (None, None) without one."""
    by_n = ratios.get((engine, precision, layout))
    if not by_n:
        return None, None
    if n in by_n:
        return by_n[n], None
    r = statistics.median(by_n.values())
    return r, f"steps_ratio {r:.3f}: median of N={', '.join(map(str, sorted(by_n)))} (not measured at N={n})"
