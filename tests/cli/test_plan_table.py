"""`scalebench plan`'s table, without a server: a terminal narrower than the table loses the optional columns, not
the key of a row, and text from the server prints as sent (a "[...]" in it is not a style)."""

from __future__ import annotations

from typing import Any

from cli.plan import OPTIONAL_COLUMNS, plan_table, print_plan
from cli.runs import console

LONG_PRECISION, LONG_LAYOUT = "fp8-rowwise-gw-hp", "pp=4+cp=2+tp=2+fsdp"


def _option(n: int, precision: str, layout: str, *, at_loss: bool = False) -> dict[str, Any]:
    measured = n == 8
    band = None if measured else 0.024
    hours = 1e12 / (5000.0 * n) / 3600
    return {
        "num_devices": n,
        "engine": "scalebench",
        "precision": precision,
        "layout": layout,
        "source": "measured" if measured else "projected",
        "tokens_per_sec": 5000.0 * n,
        "efficiency": 1.0 if measured else 0.95,
        "efficiency_low": None if band is None else 0.95 - band,
        "efficiency_high": None if band is None else 0.95 + band,
        "time_to_train_hours": hours,
        "time_to_train_hours_low": None if measured else hours * 0.97,
        "time_to_train_hours_high": None if measured else hours * 1.03,
        "gpu_hours": hours * n,
        "gpu_hours_low": None if measured else hours * n * 0.97,
        "gpu_hours_high": None if measured else hours * n * 1.03,
        "time_at_equal_loss_hours": hours * 1.01 if at_loss else None,
        "gpu_hours_at_equal_loss": hours * n * 1.01 if at_loss else None,
        "note": None,
    }


def _plan(at_loss: bool = False) -> dict[str, Any]:
    rows = []
    for n in (8, 64, 1024):
        options = [_option(n, LONG_PRECISION, LONG_LAYOUT, at_loss=at_loss), _option(n, "bf16", "fsdp")]
        rows.append({"num_devices": n, "best": options[0], "options": options})
    best = rows[-1]["best"]
    return {
        "tokens": 1e12,
        "max_gpus": 1024,
        "min_efficiency": 0.9,
        "gpu_hour_cost": None,
        "gpu_counts": [8, 64, 1024],
        "rows": rows,
        "fastest": best,
        "cheapest_efficient": best,
        "fastest_efficient": best,
        "notes": ["80% interval: see [cluster.network]"],
        "stacks": [],
        "network": {"cluster": "h100-ib", "source": "cluster 'h100-ib' [cluster.network]"},
    }


def _columns(table) -> list[str]:
    return [str(c.header) for c in table.columns]


def test_a_wide_terminal_shows_every_column_and_the_loss_columns_only_with_a_time_to_loss() -> None:
    table, hidden = plan_table(_plan(), width=400)
    assert hidden == [] and "GPU-h 80%" in _columns(table) and "time @ loss" not in _columns(table)
    table, hidden = plan_table(_plan(at_loss=True), width=400)
    assert hidden == [] and {"time @ loss", "GPU-h @ loss"} <= set(_columns(table))


def test_a_narrow_terminal_drops_optional_columns_in_order_and_keeps_every_key_whole() -> None:
    for width in (120, 100, 80):
        table, hidden = plan_table(_plan(at_loss=True), every_option=True, width=width)
        assert hidden == list(OPTIONAL_COLUMNS[: len(hidden)])  # in the documented order
        assert {"N", "precision", "layout", "E(N) ±80%", "time", "GPU-hours"} <= set(_columns(table))
        with console.capture() as cap:
            console.print(table, width=width)
        lines = cap.get().splitlines()
        assert max(len(line) for line in lines) <= width
        body = "\n".join(lines)
        assert body.count("289.4 d") == 2 and body.count("55,556") == 6 and body.count(" bf16 ") == 3  # no number cut
        if width >= 100:  # room for the row's key: whole on one line
            assert body.count(LONG_PRECISION) == 3 and body.count(LONG_LAYOUT) == 3
        else:  # none left to drop: the text folds onto a second line
            assert body.count("fp8-rowwise-gw-") == 3 and body.count("pp=4+cp=2+tp=2+f") == 3
    assert plan_table(_plan(at_loss=True), width=120)[1] == ["GPU-h 80%", "time 80%", "GPU-h @ loss", "time @ loss"]
    assert plan_table(_plan(at_loss=True), width=80)[1] == list(OPTIONAL_COLUMNS[:6])


def test_print_plan_keeps_bracketed_server_text_and_names_what_it_left_out() -> None:
    with console.capture() as cap:
        print_plan(_plan(), every_option=True)
    out = cap.get()
    assert "[cluster.network]" in out  # in the caption and in the note, as the server sent it
    assert "note: 80% interval: see [cluster.network]" in out
    assert f"fastest within the cap: N=1024 {LONG_PRECISION} {LONG_LAYOUT} (projected)" in out
    assert "not shown at this terminal's width: GPU-h 80%" in out  # the CLI's 120 columns off a terminal
