"""False alarms and detection of the nightly regression check for the derived metrics, by threshold (CPU, seconds).

    .venv/bin/python bench/nightly_thresholds.py [--series 500] [--nights 30] [--tps-noise 0.03]
        [--curves bench/results/2026-12-04-time-to-loss-h200.json] [--out PREFIX]

Each simulated series is one suite point's nights, replayed through core.analysis.regression.replay with the
metric's MetricConfig at each threshold. A run's tokens/s is uniform within +-tps-noise of nominal (both runs of
a ratio drawn independently), so E(N) and S(N) carry the noise of two runs. effective_speedup is S(N) /
steps_ratio; steps_ratio's night-to-night noise is taken from recorded loss curves: the relative spread between
the two seeds of each fp8 recipe in --curves (core.analysis.time_to_loss.match_losses on each seed alone, the
served rule). A nightly suite repeats one seed, so its steps_ratio moves less than between seeds: the seed
spread is an upper bound, and the table gives a zero-noise row beside it.

False alarm: a series without a drop with any suspected or confirmed night. Detected: a drop from night 20 on
(noise on the dropped nights too) flagged suspected on night 20 and confirmed on night 21. Prints one table;
--out writes PREFIX.md and PREFIX.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import markdown_head  # noqa: E402
from bench.time_to_loss_gpu import run_losses  # noqa: E402
from core.analysis.regression import DEFAULT_METRICS, OPEN_STATES, NightlyValue, replay  # noqa: E402
from core.analysis.time_to_loss import match_losses  # noqa: E402
from db.suites import DERIVED_THRESHOLDS  # noqa: E402

THRESHOLDS = (0.05, 0.08, 0.10, 0.12, 0.15)
ASSUMED_SD = (0.01, 0.02, 0.03)  # steps_ratio noise between nights of one seed, not measured here: a sweep
DROPS = (0.12, 0.20, 0.30)
DROP_NIGHT = 20
T0 = datetime(2026, 1, 1, 2, 0)


def _ratio(fp8: dict, bf16: dict) -> tuple[float, str] | None:
    t = match_losses([run_losses(fp8)], [run_losses(bf16)])
    return None if t.steps_ratio is None else (t.steps_ratio, t.source or "")


def steps_ratio_spread(paths: list[Path]) -> list[dict]:
    """Per file, engine and fp8 recipe: steps_ratio between seeds (repeat 0 of each) and, where a seed was run
    again, between its repeats (fp8's repeat r against bf16's repeat r: two nights of one suite), each with its
    relative standard deviation."""
    out = []
    for path in paths:
        runs = [r for r in json.loads(path.read_text())["runs"] if r["status"] == "succeeded" and r["train_loss"]]
        for engine in sorted({r["engine"] for r in runs}):
            mine = [r for r in runs if r["engine"] == engine]
            bf16 = {(r["seed"], r.get("repeat", 0)): r for r in mine if r["precision"] == "bf16"}
            for precision in sorted({r["precision"] for r in mine} - {"bf16"}):
                fp8 = {(r["seed"], r.get("repeat", 0)): r for r in mine if r["precision"] == precision}
                ratios = {k: _ratio(fp8[k], bf16[k]) for k in sorted(fp8.keys() & bf16.keys())}
                ok = {k: v for k, v in ratios.items() if v is not None}
                groups = [("between seeds", {k: v for k, v in ok.items() if k[1] == 0})]
                groups += [
                    (f"seed {seed} repeated", {k: v for k, v in ok.items() if k[0] == seed})
                    for seed in sorted({k[0] for k in ok})
                ]
                for kind, group in groups:
                    if len(group) < 2:
                        continue
                    values = [v for v, _ in group.values()]
                    out.append(
                        dict(
                            file=path.name,
                            engine=engine,
                            precision=precision,
                            kind=kind,
                            source=next(iter(group.values()))[1],
                            ratios={f"seed {k[0]} repeat {k[1]}": round(v, 4) for k, (v, _) in group.items()},
                            relative_sd=statistics.stdev(values) / statistics.fmean(values),
                        )
                    )
    return out


def nights(values: list[float]) -> list[NightlyValue]:
    return [NightlyValue(T0 + timedelta(days=i), "succeeded", v, run_id=i) for i, v in enumerate(values)]


def series(rng: random.Random, n: int, tps_noise: float, ratio_sd: float, drop: float) -> list[float]:
    """A derived metric's nights: one run over another (each +-tps_noise), over a steps_ratio with ratio_sd
    relative noise (0: the metric is S(N) or E(N)); the nights from DROP_NIGHT on are `drop` lower."""
    out = []
    for i in range(n):
        ratio = (1 + rng.uniform(-tps_noise, tps_noise)) / (1 + rng.uniform(-tps_noise, tps_noise))
        if ratio_sd:
            ratio /= max(1e-3, 1 + rng.gauss(0.0, ratio_sd))
        out.append(ratio * (1 - drop if i >= DROP_NIGHT else 1.0))
    return out


def rates(metric: str, threshold: float, args, ratio_sd: float) -> dict:
    config = replace(DEFAULT_METRICS[metric], threshold=threshold)
    alarms = 0
    detected = dict.fromkeys(DROPS, 0)
    for seed in range(args.series):
        rng = random.Random(f"{metric}-{ratio_sd}-{seed}")  # the same nights at every threshold
        base = series(rng, args.nights, args.tps_noise, ratio_sd, 0.0)
        alarms += any(f and f.state in OPEN_STATES for f in replay(nights(base), config))
        for drop in DROPS:
            rng = random.Random(f"{metric}-{ratio_sd}-{seed}-{drop}")
            dropped = base[:DROP_NIGHT] + series(rng, args.nights, args.tps_noise, ratio_sd, drop)[DROP_NIGHT:]
            states = [f.state if f else None for f in replay(nights(dropped), config)]
            detected[drop] += states[DROP_NIGHT : DROP_NIGHT + 2] == ["suspected", "confirmed"]
    return dict(
        false_alarms=alarms / args.series,
        detected={f"{d:.0%}": detected[d] / args.series for d in DROPS},
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", type=int, default=500, help="simulated series per row (default 500)")
    ap.add_argument("--nights", type=int, default=30, help="nights per series (default 30)")
    ap.add_argument("--tps-noise", type=float, default=0.03, help="a run's tokens/s uniform within +- this")
    ap.add_argument(
        "--curves",
        type=Path,
        action="append",
        help="a time_to_loss.json of bench/time_to_loss_gpu.py (repeatable; default: the recorded H200 runs)",
    )
    ap.add_argument("--out", type=Path, help="write PREFIX.md and PREFIX.json")
    args = ap.parse_args(argv)
    if args.nights <= DROP_NIGHT + 1:
        ap.error(f"--nights must be more than {DROP_NIGHT + 1} (the drop starts on night {DROP_NIGHT})")
    t0 = time.perf_counter()
    date = datetime.now(UTC).date().isoformat()
    args.curves = args.curves or [REPO / "bench/results/2026-12-04-time-to-loss-h200.json"]
    for path in args.curves:
        if not path.is_file():
            ap.error(f"--curves {path}: no such file")
    spread = steps_ratio_spread(args.curves)
    seeds = [s["relative_sd"] for s in spread if s["kind"] == "between seeds"]
    repeats = [s["relative_sd"] for s in spread if s["kind"] != "between seeds"]
    if not seeds and not repeats:
        ap.error("--curves: no fp8 recipe with two seeds or repeats that reached bf16's loss")
    cases = [
        ("efficiency", 0.0, "E(N): two runs' tokens/s"),
        ("fp8_speedup", 0.0, "S(N): two runs' tokens/s"),
        ("effective_speedup", 0.0, "S(N) / steps_ratio, steps_ratio exact"),
        *(("effective_speedup", sd, f"S(N) / steps_ratio, steps_ratio sd {sd:.0%} (assumed)") for sd in ASSUMED_SD),
    ]
    for name, sds in (("repeat", repeats), ("seed", seeds)):
        if sds:
            for how, sd in (("median", statistics.median(sds)), ("widest", max(sds))):
                if how == "widest" and sd == statistics.median(sds):
                    continue
                cases.append(
                    ("effective_speedup", sd, f"S(N) / steps_ratio, steps_ratio sd {sd:.1%} ({how} {name} spread)")
                )
    rows = []
    for metric, sd, what in cases:
        for threshold in THRESHOLDS:
            rows.append(
                dict(metric=metric, ratio_sd=sd, what=what, threshold=threshold, **rates(metric, threshold, args, sd))
            )
    elapsed = time.perf_counter() - t0

    lines = [
        "| metric | noise | threshold | false alarms | detected: " + " | ".join(f"-{d:.0%}" for d in DROPS) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in DROPS) + " |",
    ]
    for r in rows:
        shipped = " (default)" if DERIVED_THRESHOLDS.get(r["metric"]) == r["threshold"] else ""
        lines.append(
            f"| {r['metric']} | {r['what']} | {r['threshold']:.0%}{shipped} | {r['false_alarms']:.1%} | "
            + " | ".join(f"{v:.0%}" for v in r["detected"].values())
            + " |"
        )
    spread_lines = [
        "| file | engine | fp8 recipe | spread | loss | steps_ratio | relative sd |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in spread:
        by_run = ", ".join(f"{k}: {v:.3f}" for k, v in s["ratios"].items())
        spread_lines.append(
            f"| {s['file']} | {s['engine']} | {s['precision']} | {s['kind']} | {s['source']} | {by_run} | "
            f"{s['relative_sd']:.1%} |"
        )
    print("\n".join(spread_lines))
    print()
    print("\n".join(lines))
    print(f"\n{args.series} series of {args.nights} nights per row, tokens/s +-{args.tps_noise:.0%}; {elapsed:.1f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python bench/nightly_thresholds.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
        meta = dict(
            command=command,
            python=platform.python_version(),
            elapsed_s=round(elapsed, 1),
            series=args.series,
            nights=args.nights,
            tps_noise=args.tps_noise,
            curves=[
                str(p.resolve().relative_to(REPO)) if p.resolve().is_relative_to(REPO) else p.name for p in args.curves
            ],
            steps_ratio_spread=spread,
            rows=rows,
        )
        args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        head = markdown_head(f"Nightly thresholds of the derived metrics: false alarms and detection ({date})", command)
        about = (
            f"CPU only, Python {platform.python_version()}, {elapsed:.1f} s. {args.series} simulated series of "
            f"{args.nights} nights per row, a run's tokens/s uniform within +-{args.tps_noise:.0%}; a drop starts on "
            f"night {DROP_NIGHT} and counts as detected when nights {DROP_NIGHT} and {DROP_NIGHT + 1} are suspected "
            "then confirmed. steps_ratio noise: relative, normal; the measured rows take it from the loss curves of "
            + ", ".join(meta["curves"])
            + " (each seed alone through core.analysis.time_to_loss.match_losses)."
        )
        body = [*head, about, "", "## steps_ratio in the recorded curves", "", *spread_lines, "", "## Replayed"]
        args.out.with_suffix(".md").write_text("\n".join([*body, "", *lines]) + "\n")
    return 0 if all(math.isfinite(r["false_alarms"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
