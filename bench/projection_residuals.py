"""What the projection's out-of-sample misses follow: stated features, and how much is each source's own.

Reads the recorded leave-one-source-out validation (bench/projection_validation.py's JSON: the constants fitted
without each source), projects every published series from its N0 with its fold's constants, and asks two
questions of the 86 misses (miss = projected E(N) - published E(N), pp; > 0: the model is optimistic):

1. Does a feature the sources state (doublings from N0, nodes at N0, the first crossing out of one node,
   data-parallel ranks, tokens per device, the step at N0, weak or strong scaling, the sequence length, the NIC
   bandwidth per GPU, the FLOP/s per GPU at N0, fp8, pipelined, AMD) order the misses, and in the
   same direction inside several sources? Pooled Spearman rank correlation, the Pearson correlation after taking
   out each source's mean (within sources), and the correlation inside each source with 3 or more points.
2. How much of the misses is a property of the source (its stack, its cluster) rather than of N? The mean miss
   over series once each source's mean signed miss is taken out (one offset a source), and once each source's
   loss per doubling is (miss = b x log2(N / N0), one slope a source, least squares through the origin): fitted
   on the source's own points (in sample, so a bound on what one number a source buys), and on the source's
   other series only (what a publisher's other series would tell a new series of the same stack and cluster).
3. Does a stated feature, learnt across sources, carry the misses to a held-out source? The misses less
   (b0 + b1 x feature) x log2(N / N0), fitted by least absolute deviations on the other sources' points.

    python bench/projection_residuals.py [--validation JSON] [--out bench/results/DATE-projection-residuals]

CPU, under a second; writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.calibration_check import fold_constants  # noqa: E402
from bench.common import markdown_head  # noqa: E402
from bench.projection_validation import Published, load_published, misses_pp  # noqa: E402
from core.projection.network import Network  # noqa: E402

VALIDATION = REPO / "bench" / "results" / "2026-12-06-projection-validation-dgxc.json"
MIN_SOURCE_POINTS = 3  # a source's own correlation needs this many points with the feature varying


def _gpus_per_domain(s: Published) -> int:
    return int(s.network.get("nvlink_domain_gpus") or s.gpus_per_node)


def _nic_gbit_per_gpu(s: Published) -> float:
    net = Network(**s.network)  # a named platform and NIC resolve to their figures
    return net.nic_gbit_per_s * net.nics_per_gpu


def _flops_per_gpu_at_n0(s: Published) -> float:
    return s.points[s.n0] * s.workload.model_shape().flops_per_token(s.workload.seq_len)


FEATURES: dict[str, Callable[[Published, int], float]] = {
    "doublings log2(N / N0)": lambda s, n: math.log2(n / s.n0),
    "log2 nodes at N0": lambda s, n: math.log2(math.ceil(s.n0 / _gpus_per_domain(s))),
    "first crossing out of one node": lambda s, n: float(s.n0 <= _gpus_per_domain(s) < n),
    "log2 data-parallel ranks at N": lambda s, n: math.log2(s.workload.degrees(n).dp_degree),
    "log2 tokens per device per step": lambda s, n: math.log2(s.workload.tokens_per_step(n) / n),
    "log2 step at N0 (s)": lambda s, n: math.log2(s.workload.tokens_per_step(s.n0) / (s.points[s.n0] * s.n0)),
    "strong scaling": lambda s, n: float(s.workload.scaling == "strong"),
    "log2 sequence length": lambda s, n: math.log2(s.workload.seq_len),
    "log2 NIC Gb/s per GPU": lambda s, n: math.log2(_nic_gbit_per_gpu(s)),
    "log2 FLOP/s per GPU at N0": lambda s, n: math.log2(_flops_per_gpu_at_n0(s)),
    "fp8": lambda s, n: float("fp8" in s.workload.precision),
    "pipelined": lambda s, n: float(s.workload.degrees(n).pp > 1),
    "AMD": lambda s, n: float(s.vendor != "nvidia"),
}
LAD_ITERATIONS = 50  # iteratively reweighted least squares towards the least absolute deviations
LAD_FLOOR_PP = 0.05  # a residual's weight is 1 / max(|residual|, this)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their mean rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return statistics.correlation(x, y)


def _demeaned(values: Sequence[float], groups: Sequence[str]) -> list[float]:
    means = {g: statistics.fmean(v for v, h in zip(values, groups, strict=True) if h == g) for g in set(groups)}
    return [v - means[g] for v, g in zip(values, groups, strict=True)]


def rows_of(series: list[Published], fitted: dict[str, dict[str, float]]) -> list[dict]:
    """One row per published point beyond N0: its series, source, doublings, miss and every feature."""
    rows = []
    for s in series:
        for n, miss in misses_pp(s, fitted[s.source]).items():
            rows.append(
                {
                    "series": s.id,
                    "source": s.source,
                    "num_devices": n,
                    "doublings": math.log2(n / s.n0),
                    "miss_pp": miss,
                    "features": {name: f(s, n) for name, f in FEATURES.items()},
                }
            )
    return rows


def feature_table(rows: list[dict]) -> list[dict]:
    misses = [r["miss_pp"] for r in rows]
    sources = [r["source"] for r in rows]
    out = []
    for name in FEATURES:
        x = [r["features"][name] for r in rows]
        per_source = {}
        for src in sorted(set(sources)):
            idx = [i for i, s in enumerate(sources) if s == src]
            r_src = _pearson([x[i] for i in idx], [misses[i] for i in idx]) if len(idx) >= MIN_SOURCE_POINTS else None
            if r_src is not None:
                per_source[src] = r_src
        out.append(
            {
                "feature": name,
                "spearman": _pearson(_ranks(x), _ranks(misses)),
                "within_sources": _pearson(_demeaned(x, sources), _demeaned(misses, sources)),
                "per_source": per_source,
            }
        )
    return out


def _series_mean(rows: list[dict], key: str) -> float:
    by_series: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_series[r["series"]].append(abs(r[key]))
    return statistics.fmean(statistics.fmean(v) for v in by_series.values())


def _offset_slope(rs: list[dict]) -> tuple[float, float]:
    """A group's mean signed miss, and its miss per doubling (least squares through N0)."""
    offset = statistics.fmean(r["miss_pp"] for r in rs)
    slope = sum(r["miss_pp"] * r["doublings"] for r in rs) / sum(r["doublings"] ** 2 for r in rs)
    return offset, slope


def source_effects(rows: list[dict]) -> dict:
    """The mean miss over series as validated, less one offset or one slope a source: fitted on the source's own
    points (in sample), and on the source's other series only (each series as a new series of a known stack and
    cluster would be; a source of one series keeps its misses)."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_source[r["source"]].append(r)
    per_source = {}
    for src, rs in by_source.items():
        offset, slope = _offset_slope(rs)
        per_source[src] = {
            "points": len(rs),
            "series": len({r["series"] for r in rs}),
            "mean_miss_pp": offset,
            "miss_per_doubling_pp": slope,
        }
        for r in rs:
            others = [o for o in rs if o["series"] != r["series"]]
            off_out, slope_out = _offset_slope(others) if others else (0.0, 0.0)
            r |= {
                "less_offset_pp": r["miss_pp"] - offset,
                "less_slope_pp": r["miss_pp"] - slope * r["doublings"],
                "less_other_series_offset_pp": r["miss_pp"] - off_out,
                "less_other_series_slope_pp": r["miss_pp"] - slope_out * r["doublings"],
            }
    return {
        "series_mean_abs_miss_pp": _series_mean(rows, "miss_pp"),
        "less_source_offset_pp": _series_mean(rows, "less_offset_pp"),
        "less_source_slope_pp": _series_mean(rows, "less_slope_pp"),
        "less_other_series_offset_pp": _series_mean(rows, "less_other_series_offset_pp"),
        "less_other_series_slope_pp": _series_mean(rows, "less_other_series_slope_pp"),
        "per_source": dict(sorted(per_source.items())),
    }


def _lad(xs: list[tuple[float, ...]], ys: list[float], iterations: int = LAD_ITERATIONS) -> tuple[float, ...]:
    """Least absolute deviations through the origin, one or two coefficients (reweighted least squares; one
    iteration is ordinary least squares)."""
    k = len(xs[0])
    weights = [1.0] * len(ys)
    beta: tuple[float, ...] = (0.0,) * k
    for _ in range(iterations):
        a = [[sum(w * x[i] * x[j] for w, x in zip(weights, xs, strict=True)) for j in range(k)] for i in range(k)]
        b = [sum(w * x[i] * y for w, x, y in zip(weights, xs, ys, strict=True)) for i in range(k)]
        if k == 1:
            beta = (b[0] / a[0][0],)
        else:
            det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
            if abs(det) < 1e-12 * max(1.0, abs(a[0][0] * a[1][1])):  # the feature is one value: slope only
                beta = (b[0] / a[0][0], 0.0)
            else:
                beta = ((b[0] * a[1][1] - b[1] * a[0][1]) / det, (a[0][0] * b[1] - a[1][0] * b[0]) / det)
        weights = [
            1 / max(abs(y - sum(c * v for c, v in zip(beta, x, strict=True))), LAD_FLOOR_PP)
            for x, y in zip(xs, ys, strict=True)
        ]
    return beta


def cross_source_corrections(rows: list[dict]) -> list[dict]:
    """Each stated feature as a loss per doubling learnt from the other sources: miss ~ (b0 + b1 x feature) x
    doublings, fitted by least absolute deviations on every source but the held-out one and taken off its misses
    (the first row: b0 alone). The mean abs miss over series that is left, per feature, and with ordinary least
    squares instead (which the six large misses pull)."""
    sources = sorted({r["source"] for r in rows})
    out = []
    for name in [None, *FEATURES]:

        def x(r: dict, name: str | None = name) -> tuple[float, ...]:
            d = r["doublings"]
            return (d,) if name is None else (d, r["features"][name] * d)

        left = []
        for src in sources:
            train = [r for r in rows if r["source"] != src]
            lad = _lad([x(r) for r in train], [r["miss_pp"] for r in train])
            ols = _lad([x(r) for r in train], [r["miss_pp"] for r in train], iterations=1)
            left += [
                {
                    "series": r["series"],
                    "lad_pp": r["miss_pp"] - sum(c * v for c, v in zip(lad, x(r), strict=True)),
                    "ols_pp": r["miss_pp"] - sum(c * v for c, v in zip(ols, x(r), strict=True)),
                }
                for r in rows
                if r["source"] == src
            ]
        out.append(
            {
                "feature": name,
                "series_mean_abs_miss_pp": _series_mean(left, "lad_pp"),
                "least_squares_pp": _series_mean(left, "ols_pp"),
            }
        )
    return out


def _r(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def markdown(report: dict) -> str:
    e = report["source_effects"]
    lines = [
        *markdown_head(f"What the projection's out-of-sample misses follow ({report['date']})", report["command"]),
        f"CPU only, Python {report['python']}, {report['wall_s']:.2f} s. The constants fitted without each source "
        f"come from `{report['validation']}` (variant: {report['variant']}); {report['num_points']} published "
        f"points beyond each series' N0, {report['num_series']} series, {report['num_sources']} sources. "
        "miss = projected E(N) - published E(N), pp (> 0: optimistic).",
        "",
        "## Stated features",
        "",
        "| feature | Spearman (all points) | Pearson within sources | inside each source with 3+ points |",
        "| --- | --- | --- | --- |",
    ]
    for f in report["features"]:
        inside = ", ".join(f"{src} {_r(r)}" for src, r in f["per_source"].items()) or "-"
        lines.append(f"| {f['feature']} | {_r(f['spearman'])} | {_r(f['within_sources'])} | {inside} |")
    lines += [
        "",
        "## Each source's own share",
        "",
        "One number a source taken out of its misses: fitted on the source's own points (in sample, so a bound on",
        "what one number a source buys: a source of one point is then missed by nothing), and on the source's other",
        "series only (a source of one series keeps its misses).",
        "",
        "| reading | mean abs miss over series, pp |",
        "| --- | --- |",
        f"| as validated (from N0 alone) | {e['series_mean_abs_miss_pp']:.2f} |",
        f"| less one offset a source, in sample (its mean signed miss) | {e['less_source_offset_pp']:.2f} |",
        f"| less one loss per doubling a source, in sample (its slope through N0) | {e['less_source_slope_pp']:.2f} |",
        f"| less the offset of the source's other series | {e['less_other_series_offset_pp']:.2f} |",
        f"| less the loss per doubling of the source's other series | {e['less_other_series_slope_pp']:.2f} |",
        "",
        "| source | series | points | mean signed miss, pp | miss per doubling, pp |",
        "| --- | --- | --- | --- | --- |",
    ]
    for src, v in e["per_source"].items():
        lines.append(
            f"| {src} | {v['series']} | {v['points']} | {v['mean_miss_pp']:+.2f} | {v['miss_per_doubling_pp']:+.2f} |"
        )
    lines += [
        "",
        "## A stated feature learnt across sources",
        "",
        "miss ~ (b0 + b1 x feature) x log2(N / N0), fitted by least absolute deviations on the other sources' points",
        "and taken off the held-out source's misses (leave one source out, as the validation). The first row fits b0",
        f"alone. As validated: {e['series_mean_abs_miss_pp']:.2f} pp.",
        "",
        "| feature | mean abs miss over series, pp | the same fitted by least squares, pp |",
        "| --- | --- | --- |",
    ]
    for c in report["cross_source"]:
        lines.append(
            f"| {c['feature'] or 'none (one loss per doubling)'} | {c['series_mean_abs_miss_pp']:.2f} "
            f"| {c['least_squares_pp']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> str:
    """A path as a report names it: relative to the repository where it lies inside it."""
    full = path.resolve()
    return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else str(path)


def main() -> None:
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validation", type=Path, default=VALIDATION, help="a projection_validation.py JSON")
    ap.add_argument("--out", type=Path, default=None, help="writes OUT.md and OUT.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    recorded = json.loads(args.validation.read_text())
    variant = recorded["shipped_variant"]
    fitted = fold_constants(recorded)
    series = load_published()
    rows = rows_of(series, fitted)
    report = {
        "date": date.today().isoformat(),
        "command": "python bench/projection_residuals.py" + (f" --out {_shown(args.out)}" if args.out else ""),
        "validation": _shown(args.validation),
        "variant": variant,
        "num_points": len(rows),
        "num_series": len({r["series"] for r in rows}),
        "num_sources": len({r["source"] for r in rows}),
        "features": feature_table(rows),
        "source_effects": source_effects(rows),
        "cross_source": cross_source_corrections(rows),
        "rows": rows,
    }
    report["wall_s"] = time.perf_counter() - t0
    report["python"] = platform.python_version()
    text = markdown(report)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
