"""PNG rendering of a ScalingReport: throughput (with the ideal linear line), efficiency, fp8 speedup vs N.

Uses matplotlib's object API on an Agg canvas: no pyplot, so no global figure registry grows in a
long-running API process and nothing needs a display.
"""

from __future__ import annotations

import io

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter
from matplotlib.transforms import blended_transform_factory

from core.analysis.scaling import ScalingReport, Series

PRECISION_COLORS = {
    "bf16": "#1f77b4",
    "fp8-tensorwise": "#ff7f0e",
    "fp8-rowwise": "#2ca02c",
    "fp8-rowwise-gw-hp": "#9467bd",
    "fp32": "#7f7f7f",
}
LAYOUT_STYLES = ("-", "--", "-.", ":")
FAILED_COLOR = "#d62728"


ENGINE_MARKERS = {"scalebench": "o", "torchtitan": "s"}  # command engines: "^"


def _label(s: Series, multi_model: bool, multi_cluster: bool, multi_engine: bool = False) -> str:
    k = s.key
    parts = [k.precision, k.layout]
    if multi_engine:
        parts.insert(0, k.engine)
    if multi_model:
        parts.insert(0, f"{k.model}/L{k.num_layers}")
    if multi_cluster:
        parts.append(f"@{k.cluster}")
    return " · ".join(parts)


def _style(s: Series, layouts: list[str]) -> dict:
    return {
        "color": PRECISION_COLORS.get(s.key.precision, "black"),
        "linestyle": LAYOUT_STYLES[layouts.index(s.key.layout) % len(LAYOUT_STYLES)],
        "marker": ENGINE_MARKERS.get(s.key.engine, "^"),
        "markersize": 4,
        "linewidth": 1.5,
    }


def _measured(s: Series, attr: str) -> tuple[list[int], list[float]]:
    pts = [p for p in s.points if getattr(p, attr) is not None]
    return [p.num_devices for p in pts], [getattr(p, attr) for p in pts]


def _draw_failures(ax: Axes, s: Series, label: str | None) -> bool:
    """Failed points as red x markers along the bottom of the panel (they have no value to plot at)."""
    ns = [p.num_devices for p in s.points if p.status == "failed"]
    if ns:
        trans = blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(
            ns,
            [0.04] * len(ns),
            transform=trans,
            marker="x",
            color=FAILED_COLOR,
            s=50,
            linewidths=2,
            zorder=5,
            label=label,
            clip_on=False,
        )
    return bool(ns)


def _throughput(ax: Axes, s: Series, style: dict, label: str) -> None:
    ns, xs = _measured(s, "tokens_per_sec")
    if not ns:
        return
    lo = [x - (p.tokens_per_sec_min or x) for p, x in zip([p for p in s.points if p.tokens_per_sec], xs)]
    hi = [(p.tokens_per_sec_max or x) - x for p, x in zip([p for p in s.points if p.tokens_per_sec], xs)]
    ax.errorbar(ns, xs, yerr=[lo, hi], label=label, capsize=2, **style)
    n0 = s.baseline_num_devices
    x0 = next((p.tokens_per_sec for p in s.points if p.num_devices == n0), None)
    if n0 and x0:
        ideal = [x0 * n / n0 for n in ns]
        ax.plot(ns, ideal, color=style["color"], linestyle=(0, (1, 2)), linewidth=1, alpha=0.7)


def _setup_axes(ax: Axes, gpu_counts: list[int], ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(gpu_counts))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(gpu_counts) / 1.3, max(gpu_counts) * 1.3)  # failed points have no y to autoscale on
    ax.set_xlabel("GPUs N (log2 scale)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)


def _speedup_panel(ax: Axes, report: ScalingReport, styles: dict, labels: dict) -> None:
    drawn = False
    for s in report.series:
        ns, ss = _measured(s, "fp8_speedup")
        if ns:
            ax.plot(ns, ss, label=labels[s.key], **styles[s.key])
            drawn = True
    ax.axhline(1.0, color="gray", linewidth=1, linestyle="--")
    if not drawn:
        ax.text(0.5, 0.5, "no fp8/bf16 pair measured", transform=ax.transAxes, ha="center", color="gray")


def render_scaling_png(report: ScalingReport, *, title: str | None = None, dpi: int = 100) -> bytes:
    """Three panels side by side (throughput with ideal lines, efficiency, fp8 speedup), as PNG bytes."""
    fig = Figure(figsize=(15, 4.8), dpi=dpi)
    # fixed margins: constrained layout measures every tick label and doubles the render time
    fig.subplots_adjust(left=0.055, right=0.99, bottom=0.11, top=0.88, wspace=0.25)
    FigureCanvasAgg(fig)
    ax_x, ax_e, ax_s = fig.subplots(1, 3)
    counts = report.gpu_counts or [1]
    layouts = sorted({s.key.layout for s in report.series})
    multi_model = len({(s.key.model, s.key.num_layers) for s in report.series}) > 1
    multi_cluster = len({s.key.cluster for s in report.series}) > 1
    multi_engine = len({s.key.engine for s in report.series}) > 1
    styles = {s.key: _style(s, layouts) for s in report.series}
    labels = {s.key: _label(s, multi_model, multi_cluster, multi_engine) for s in report.series}
    failed_labelled = False
    for s in report.series:
        _throughput(ax_x, s, styles[s.key], labels[s.key])
        ns, es = _measured(s, "efficiency")
        if ns:
            ax_e.plot(ns, [100 * e for e in es], label=labels[s.key], **styles[s.key])
        for ax in (ax_x, ax_e):
            failed_labelled |= _draw_failures(ax, s, None if failed_labelled else "failed run")
    ax_e.axhline(100.0, color="gray", linewidth=1, linestyle="--")
    _speedup_panel(ax_s, report, styles, labels)
    _setup_axes(ax_x, counts, "global throughput X(N) (tokens/s)", "Throughput (dotted: ideal linear from N0)")
    if any(p.tokens_per_sec for s in report.series for p in s.points):
        ax_x.set_yscale("log")  # only with data: a log axis cannot autoscale on nothing
    _setup_axes(ax_e, counts, "scaling efficiency E(N) (%)", "Scaling efficiency")
    _setup_axes(ax_s, counts, "fp8 speedup over bf16 S(N) (x)", "fp8 speedup (same layout and N)")
    # fixed legend corners: loc="best" scans every plotted point and costs a tenth of a second
    for ax, loc in ((ax_x, "upper left"), (ax_e, "lower left"), (ax_s, "lower right")):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc=loc)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
