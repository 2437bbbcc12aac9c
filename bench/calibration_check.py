"""Does calibrating on the measured points beyond N0 project the larger N better? Checked on published series (CPU,
seconds).

    .venv/bin/python bench/calibration_check.py [--validation JSON] [--out bench/results/DATE-calibration-check]

A team that measured a series at N0 < N1 < ... < Nk asks for E beyond Nk. The product can project from N0 alone
(calibrate=false) or first fit the inter-node efficiency and the device speed spread to the measured points beyond
N0 (calibrate=true, core.projection.model.calibrated_efficiency: the same fit project_series runs). Every published
series of three or more points (bench/published) is cut at each k from 1 to its second-to-last point: the points up
to Nk are "measured", the later ones are what either projection must hit. Both start from the constants fitted
without the series' source (leave one source out, read from the validation report given, so that neither has seen
the source), and a third reading continues the measured curve by the model's shape: E(N) = E(Nk) x E0(N) / E0(Nk),
E0 the projection from N0 alone. miss = projected - published E(N), percentage points.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import markdown_head  # noqa: E402
from bench.projection_validation import Published, load_published, network_for  # noqa: E402
from core.projection.constants import INTERVAL_Q_PP  # noqa: E402
from core.projection.model import calibrated_efficiency, projected_efficiency, spans_nodes  # noqa: E402

VALIDATION = REPO / "bench" / "results" / "2026-12-06-projection-validation-dgxc.json"
READINGS = ("from N0 alone", "calibrated", "continued")


def fold_constants(validation: dict) -> dict[str, dict[str, float]]:
    """Source -> the shipped variant's constants fitted without that source (the validation report's)."""
    return validation["variants"][validation["shipped_variant"]]["fitted_per_held_out_source"]


def cuts(s: Published, constants: dict[str, float]) -> list[dict]:
    """One row per (cut k, later N): the three readings' misses, pp."""
    ns, pub = sorted(s.points), s.published_efficiency()
    x = {n: s.points[n] * n for n in ns}  # global tokens/s
    net, w = network_for(s, constants), s.workload
    alone = projected_efficiency(w, net, s.gpus_per_node, ns[0], x[ns[0]], ns)
    rows = []
    for k in range(1, len(ns) - 1):
        cal, calibration = calibrated_efficiency(w, net, s.gpus_per_node, {n: x[n] for n in ns[: k + 1]}, ns)
        nk = ns[k]
        for n in ns[k + 1 :]:
            readings = (alone[n], cal[n], pub[nk] * alone[n] / alone[nk])
            rows.append(
                {
                    "across_nodes": spans_nodes(ns[: k + 1], ns[0], s.gpus_per_node),
                    "series": s.id,
                    "source": s.source,
                    "measured_up_to": nk,
                    "num_devices": n,
                    "published": pub[n],
                    "fitted": calibration.parameters,
                    "miss_pp": dict(zip(READINGS, (100 * (e - pub[n]) for e in readings), strict=True)),
                }
            )
    return rows


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for r in READINGS:
        misses = [abs(row["miss_pp"][r]) for row in rows]
        by_cut: dict[tuple, list[float]] = {}
        for row in rows:
            by_cut.setdefault((row["series"], row["measured_up_to"]), []).append(abs(row["miss_pp"][r]))
        out[r] = {
            "mean_abs_miss_pp": statistics.fmean(misses),
            "mean_over_cuts_pp": statistics.fmean(statistics.fmean(v) for v in by_cut.values()),
            "median_abs_miss_pp": statistics.median(misses),
            "worst_abs_miss_pp": max(misses),
            "within_interval": sum(m <= INTERVAL_Q_PP for m in misses) / len(misses),
        }
    wins = sum(abs(row["miss_pp"]["calibrated"]) < abs(row["miss_pp"]["from N0 alone"]) for row in rows)
    out["calibrated"]["closer_than_from_n0"] = wins / len(rows)
    return out


def per_source(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Source -> its number of later points and each reading's mean absolute miss over them (one publisher's many
    cuts weigh as much as it has points in the pooled figures; here each source is one row)."""
    out: dict[str, dict[str, float]] = {}
    for source in sorted({row["source"] for row in rows}):
        mine = [row for row in rows if row["source"] == source]
        out[source] = {"points": len(mine)} | {
            r: statistics.fmean(abs(row["miss_pp"][r]) for row in mine) for r in READINGS
        }
    return out


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        *markdown_head(
            f"Calibration on measured points beyond N0, checked on published series ({report['date']})",
            report["command"],
        ),
        f"CPU only: Python {report['python']}, {report['wall_s']:.1f} s. Constants: fitted without each series' "
        f"source, from `{report['validation']}`. {report['num_series']} series of three or more published points, "
        f"cut after each of their points but the last: {report['num_cuts']} cuts, {len(report['rows'])} later "
        "points to hit. miss = projected - published E(N), pp; the 80% interval's half-width is "
        f"{INTERVAL_Q_PP} pp.",
        "",
        "| reading | mean abs miss (points) | mean over cuts | median | worst | within the interval |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in READINGS:
        v = s[r]
        lines.append(
            f"| {r} | {v['mean_abs_miss_pp']:.2f} | {v['mean_over_cuts_pp']:.2f} | {v['median_abs_miss_pp']:.2f} | "
            f"{v['worst_abs_miss_pp']:.2f} | {v['within_interval']:.0%} |"
        )
    sources = report["per_source"]
    lines += [
        "",
        f"Calibrated is closer than from N0 alone at {s['calibrated']['closer_than_from_n0']:.0%} of the points. "
        f"{report['num_cuts_across_nodes']} of the {report['num_cuts']} cuts have a measured point beyond N0 across "
        "nodes (where the API calibrates unless told otherwise: core.projection.model.spans_nodes).",
        "",
        "Per source (mean abs miss over its later points, pp; the pooled figures weigh a source by its points):",
        "",
        "| source | points | " + " | ".join(READINGS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in READINGS) + " |",
    ]
    for source, v in sorted(sources.items(), key=lambda kv: -kv[1]["points"]):
        lines.append(f"| {source} | {v['points']:.0f} | " + " | ".join(f"{v[r]:.2f}" for r in READINGS) + " |")
    means = {r: statistics.fmean(v[r] for v in sources.values()) for r in READINGS}
    lines += [
        f"| mean over the {len(sources)} sources | | " + " | ".join(f"{means[r]:.2f}" for r in READINGS) + " |",
        "",
        "| series | measured up to | N | published E | from N0 alone | calibrated | continued | fitted |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        m = row["miss_pp"]
        fitted = ", ".join(f"{k}={v:.3g}" for k, v in row["fitted"].items()) or "-"
        lines.append(
            f"| {row['series']} | {row['measured_up_to']} | {row['num_devices']} | {row['published']:.4f} | "
            f"{m['from N0 alone']:+.2f} | {m['calibrated']:+.2f} | {m['continued']:+.2f} | {fitted} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validation", type=Path, default=VALIDATION, help="a projection_validation.py JSON report")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = ap.parse_args()
    t0 = time.monotonic()
    folds = fold_constants(json.loads(args.validation.read_text()))
    series = [s for s in load_published() if len(s.points) >= 3]
    rows = [row for s in series for row in cuts(s, folds[s.source])]
    report = {
        "date": dt.date.today().isoformat(),
        "command": "python bench/calibration_check.py" + (f" --out {args.out}" if args.out else ""),
        "validation": str(args.validation.resolve().relative_to(REPO)),
        "python": platform.python_version(),
        "num_series": len(series),
        "num_cuts": len({(r["series"], r["measured_up_to"]) for r in rows}),
        "num_cuts_across_nodes": len({(r["series"], r["measured_up_to"]) for r in rows if r["across_nodes"]}),
        "summary": summary(rows),
        "per_source": per_source(rows),
        "rows": rows,
    }
    report["wall_s"] = time.monotonic() - t0
    text = markdown(report)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
