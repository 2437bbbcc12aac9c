"""The aggregated scaling reads and the stored loss curves give what the per-run reads gave, on PostgreSQL
(GROUP BY in the database) and SQLite (the per-run rows aggregated in Python)."""

from __future__ import annotations

import random
import statistics

import pytest
import sqlalchemy as sa

import core.analysis.scaling
import db.points
from core.analysis.scaling import build_report, build_report_from_points
from core.contracts.matrix import expand
from core.contracts.specs import RunResult
from db.imports import record_imported, store_results
from db.models import Run, RunLossCurve
from db.runs import claim_run, mark_cancelled, mark_failed, record_result
from db.session import session_scope
from tests.db.helpers import add_experiment, make_spec


def _result(key: str, rng: random.Random, n: int, num_steps: int = 6, *, final_loss: bool = True) -> RunResult:
    """A succeeded result with full-precision random values (so that a median off by one ulp would show)."""
    tps = rng.uniform(900, 1100) * n
    steps = [
        {"step": i, "loss": 6.0 - 0.1 * i + rng.random() / 7, "step_ms": 100.0, "tokens": 512} for i in range(num_steps)
    ]
    summary = dict(
        num_timed_steps=num_steps,
        tokens_per_step=512,
        tokens_per_sec=tps,
        tokens_per_sec_per_device=tps / n,
        step_ms_median=rng.uniform(90, 110),
        step_ms_min=80.0,
        step_ms_max=120.0,
        flops_per_token=1000,
        tflops_per_device=0.1,
        mfu_vs_bf16_peak=rng.choice([None, rng.random()]),
        mfu_vs_precision_peak=rng.random(),
        peak_memory_allocated_gib=rng.uniform(1, 2) * n,
    )
    numerics = {"final_loss": steps[-1]["loss"]} if final_loss else {}
    return RunResult.model_validate(
        {"run_key": key, "status": "succeeded", "steps": steps, "summary": summary, "numerics": numerics}
    )


def _seed(factory, seed: int = 0) -> tuple[int, dict]:
    """An experiment of 2 precisions x 2 layouts x 3 N x 5 repeats whose runs ended every way a run can
    (succeeded, failed, cancelled, still queued or running; some without a final loss); its id and, per
    (precision, layout, N), the tokens/s of the succeeded runs (what the medians must come from)."""
    rng = random.Random(seed)
    with session_scope(factory) as s:
        exp_id, run_ids = add_experiment(s, layouts=["fsdp", "ddp"], repeats=5)
    xs: dict[tuple, list[float]] = {}
    with session_scope(factory) as s:
        rows = s.execute(
            sa.select(Run.id, Run.run_key, Run.precision, Run.layout, Run.num_devices).where(
                Run.experiment_id == exp_id
            )
        ).all()
        for run_id, key, precision, layout, n in rows:
            fate = rng.choice(["ok"] * 6 + ["failed", "cancelled", "queued", "running", "no_loss"])
            if fate == "queued":
                continue
            if fate == "cancelled":
                mark_cancelled(s, run_id)
                continue
            claim_run(s, run_id, "w", "h", 60)
            if fate == "failed":
                mark_failed(s, run_id, "oom", "out of memory")
            elif fate != "running":
                result = _result(key, rng, n, final_loss=fate != "no_loss")
                record_result(s, run_id, result)
                xs.setdefault((precision, layout, n), []).append(result.summary.tokens_per_sec)
    return exp_id, xs


def _both(session, experiment_ids: list[int], **kw) -> tuple[list[str], list[str]]:
    """The reports of the per-run path (build_report over load_run_points, as the API built them before)
    and of the aggregated path, as JSON, fits computed afresh for each."""
    old, new = [], []
    per_run = db.points.load_run_points_many(session, experiment_ids)
    known: dict = {}
    aggregated = db.points.load_scaling_points_many(session, experiment_ids, known)
    assert db.points.load_scaling_points_many(session, experiment_ids, known) == aggregated  # from the kept values
    for i in experiment_ids:
        core.analysis.scaling._amdahl_params.cache_clear()
        core.analysis.scaling._usl_params.cache_clear()
        old.append(build_report(per_run[i], **kw).model_dump_json())
        core.analysis.scaling._amdahl_params.cache_clear()
        core.analysis.scaling._usl_params.cache_clear()
        new.append(build_report_from_points(aggregated[i], **kw).model_dump_json())
    return old, new


@pytest.mark.parametrize("seed", [0, 1])
def test_aggregated_points_give_the_per_run_report_point_for_point(factory, seed) -> None:
    exp_id, xs = _seed(factory, seed)
    with factory() as s:
        other, _ = add_experiment(s, precisions=["bf16"], gpu_counts=[1, 2, 4, 8])  # nothing ran yet
        points = db.points.load_scaling_points(s, exp_id)
        for kw in ({}, {"baseline_num_devices": 2, "full_size_by_cluster": {"local-cpu": 64}}):
            old, new = _both(s, [exp_id, other], **kw)
            assert new == old
        report = build_report_from_points(points)
    assert len(points) == 2 * 2 * 3  # one aggregate per (series, N), not one per run
    measured = {(sr.key.precision, sr.key.layout, p.num_devices): p for sr in report.series for p in sr.points}
    assert len(xs) >= 6
    for k, values in xs.items():  # the medians come from the seeded values, not from either code path
        p = measured[k]
        assert p.tokens_per_sec == statistics.median(values) and p.num_succeeded == len(values)
        assert (p.tokens_per_sec_min, p.tokens_per_sec_max) == (min(values), max(values))
    assert any(len(v) % 2 == 0 for v in xs.values()) and any(len(v) % 2 for v in xs.values())  # both median kinds


def _statements(engine: sa.Engine, fn) -> tuple[object, list[str]]:
    """fn()'s value and the SQL statements it ran."""
    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    sa.event.listen(engine, "before_cursor_execute", listener)
    try:
        return fn(), statements
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)


def test_points_are_aggregated_by_the_database_once_per_change(pg_session_factory, pg_engine) -> None:
    """An index-only GROUP BY for every read; the summary medians only for points whose succeeded runs
    changed since the values were kept: none when nothing changed, the one point of a finished run."""
    exp_id, _ = _seed(pg_session_factory)
    known: dict = {}

    def read() -> list:
        with pg_session_factory() as s:
            return db.points.load_scaling_points(s, exp_id, known)

    first, sql = _statements(pg_engine, read)
    assert len(sql) == 2 and "percentile_disc" in sql[1] and ") IN (" not in sql[1]
    assert "GROUP BY" in sql[0] and all("step_metrics" not in q and "spec" not in q for q in sql)
    again, sql = _statements(pg_engine, read)
    assert len(sql) == 1 and again == first and len(known) == sum(p.num_succeeded > 0 for p in first)
    with session_scope(pg_session_factory) as s:  # one more run of one point ends
        run_id, key, n, status = s.execute(
            sa.select(Run.id, Run.run_key, Run.num_devices, Run.status)
            .where(Run.experiment_id == exp_id, Run.status.in_(["queued", "running"]))
            .order_by(Run.id)
        ).first()
        if status == "queued":
            claim_run(s, run_id, "w", "h", 60)
        record_result(s, run_id, _result(key, random.Random(9), n))
    changed, sql = _statements(pg_engine, read)
    assert len(sql) == 2 and "percentile_disc" in sql[1] and ") IN (" in sql[1]  # that one point only
    with pg_session_factory() as s:
        assert changed == db.points.load_scaling_points(s, exp_id) != first  # as aggregated from scratch
    assert sum(a != b for a, b in zip(changed, first)) == 1


def test_imported_runs_read_final_loss_from_their_result(factory) -> None:
    """Imports store summaries without the final_loss column: the aggregate falls back to the result JSON."""
    spec = make_spec(precisions=["bf16"], gpu_counts=[1, 2], repeats=2)
    from core.contracts.clusters import LOCAL_CPU

    runs, _ = expand(spec, LOCAL_CPU)
    rng = random.Random(3)
    with session_scope(factory) as s:
        results = [_result(r.run_key(), rng, r.num_devices) for r in runs]
        exp, run_ids = record_imported(s, spec, runs, results)
        store_results(s, list(zip(run_ids, results)))  # the import path stores the result JSON in its own step
        exp_id = exp.id
    with factory() as s:
        old, new = _both(s, [exp_id])
    assert new == old and '"final_loss":null' not in new[0] and '"imported"' in new[0]


def test_one_finished_run_refits_one_series(factory, monkeypatch) -> None:
    exp_id, _ = _seed(factory)
    with session_scope(factory) as s:
        extra, _ = add_experiment(s, precisions=["bf16"], layouts=["fsdp"], repeats=2)
    with session_scope(factory) as s:  # every run of `extra` succeeded but its first, still running
        rows = s.execute(
            sa.select(Run.id, Run.run_key, Run.num_devices).where(Run.experiment_id == extra).order_by(Run.id)
        ).all()
        for run_id, key, n in rows:
            claim_run(s, run_id, "w", "h", 60)
            if run_id != rows[0].id:
                record_result(s, run_id, _result(key, random.Random(run_id), n))
    calls: list[tuple] = []
    real = core.analysis.scaling.fit_usl
    monkeypatch.setattr(core.analysis.scaling, "fit_usl", lambda ns, xs: calls.append(tuple(ns)) or real(ns, xs))
    core.analysis.scaling._usl_params.cache_clear()

    def build_both(**kw) -> int:
        with factory() as s:
            reports = [build_report_from_points(db.points.load_scaling_points(s, i), **kw) for i in (exp_id, extra)]
        return sum(sr.usl.fitted for r in reports for sr in r.series)

    fitted = build_both()
    assert fitted >= 3 and len(calls) == fitted
    build_both(full_size_by_cluster={"local-cpu": 16}, baseline_num_devices=2)
    assert len(calls) == fitted  # a new full size or N0 reuses every fit
    with session_scope(factory) as s:
        record_result(s, rows[0].id, _result(rows[0].run_key, random.Random(1), rows[0].num_devices))
    build_both()
    assert len(calls) == fitted + 1  # the one series whose X(N) moved


# ------------------------------------------------------------------------------------------- loss curves


def _finish_with_steps(factory, exp_id: int, num_steps: int) -> None:
    rng = random.Random(num_steps)
    with session_scope(factory) as s:
        for run_id, key, n in s.execute(
            sa.select(Run.id, Run.run_key, Run.num_devices).where(Run.experiment_id == exp_id)
        ).all():
            claim_run(s, run_id, "w", "h", 60)
            record_result(s, run_id, _result(key, rng, n, num_steps=num_steps))


def test_stored_curves_serve_what_step_thinning_served(factory) -> None:
    """Up to STORED_CURVE_POINTS steps the stored curve is whole: every max_points gives exactly the curve
    thinned from the step rows (the previous read)."""
    with session_scope(factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_with_steps(factory, exp_id, 1001)
    with factory() as s:
        for max_points in (2, 7, 200, 1000, 1001, 2000):
            curves = db.points.loss_curves(s, exp_id, max_points=max_points)
            by_steps = db.points._thinned_steps(s, [c.run_id for c in curves], max_points)
            assert len(curves) == 6 and {c.source for c in curves} == {"store"}
            for c in curves:
                assert (c.num_steps, c.steps, c.losses) == by_steps[c.run_id], (max_points, c.run_id)
                assert c.stored_stride == 1 and len(c.steps) <= max_points


def test_long_curves_are_stored_thinned_and_read_without_step_rows(pg_session_factory, pg_engine) -> None:
    with session_scope(pg_session_factory) as s:
        exp_id, _ = add_experiment(s, precisions=["bf16"], gpu_counts=[1])
    _finish_with_steps(pg_session_factory, exp_id, 4500)
    statements: list[str] = []
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    sa.event.listen(pg_engine, "before_cursor_execute", listener)
    try:
        with pg_session_factory() as s:
            [curve] = db.points.loss_curves(s, exp_id, max_points=2000)
            [small] = db.points.loss_curves(s, exp_id, max_points=5)
            steps = [st for (st,) in s.execute(sa.text("SELECT step FROM step_metrics ORDER BY step"))]
    finally:
        sa.event.remove(pg_engine, "before_cursor_execute", listener)
    assert not any("step_metrics" in q for q in statements[:-1])
    assert curve.num_steps == 4500 and curve.stored_stride == 3 and curve.source == "store"
    assert curve.steps == steps[::3] + [4499] and len(curve.steps) == 1501  # the stored points, all of them
    assert small.steps == [0, 1125, 2250, 3375, 4499]  # stored indices 0, 375, .., 1500


def test_runs_without_a_stored_curve_are_thinned_from_steps(factory) -> None:
    with session_scope(factory) as s:
        exp_id, _ = add_experiment(s)
    _finish_with_steps(factory, exp_id, 300)
    with factory() as s:
        before = db.points.loss_curves(s, exp_id, max_points=50)
    with session_scope(factory) as s:
        s.execute(sa.delete(RunLossCurve).where(RunLossCurve.run_id == before[0].run_id))
    with factory() as s:
        after = db.points.loss_curves(s, exp_id, max_points=50)
    assert [c.source for c in after] == ["steps"] + ["store"] * 5
    assert [(c.steps, c.losses) for c in after] == [(c.steps, c.losses) for c in before]


def _with_eval(result: RunResult, every: int) -> RunResult:
    evals = [
        {"step": s.step, "loss": s.loss + 0.5, "num_tokens": 1024} for s in result.steps if (s.step + 1) % every == 0
    ]
    numerics = {**result.numerics.model_dump(), "eval_curve": evals}
    return result.model_copy(update={"numerics": type(result.numerics).model_validate(numerics)})


def test_record_result_stores_the_curve_digest_and_reads_give_it_back(factory) -> None:
    """The digest stored with the curve (training and held-out points) is the pure function's, bit for bit;
    a row stored without one (before digests were stored) is digested when read, to the same value."""
    from core.analysis.curves import digest_curve

    with session_scope(factory) as s:
        exp_id, run_ids = add_experiment(s, precisions=["bf16"])
    result = _with_eval(_result("k", random.Random(3), 1, num_steps=300), every=25)
    with session_scope(factory) as s:
        claim_run(s, run_ids[0], "w", "h", 60)
        record_result(s, run_ids[0], result)
    expected = digest_curve(
        [(st.step, st.loss) for st in result.steps],
        [(e.step, e.loss) for e in result.numerics.eval_curve],
        run_id=str(run_ids[0]),
        seed=0,
    )
    assert len(expected.bin_steps) == 60 and len(expected.eval_steps) == 12  # width ceil(300 / 64) = 5
    with factory() as s:
        assert db.points.load_run_digests(s, [run_ids[0]]) == {str(run_ids[0]): expected}
    with session_scope(factory) as s:
        s.execute(sa.update(RunLossCurve).values(digest_f64=None))
    with factory() as s:
        assert db.points.load_run_digests(s, [run_ids[0], 10**9]) == {str(run_ids[0]): expected}


def test_a_cold_report_reads_digests_only_for_pairs_it_has_not_seen(pg_session_factory, pg_engine) -> None:
    """The verdict and time to loss of a pair are kept by its runs; the next cold read loads no digest."""
    from core.analysis.scaling import loss_pairs, numerics_key

    with session_scope(pg_session_factory) as s:
        exp_id, run_ids = add_experiment(s, precisions=["bf16", "fp8-tensorwise"], repeats=2)
    with session_scope(pg_session_factory) as s:
        for run_id, key in s.execute(sa.select(Run.id, Run.run_key).where(Run.experiment_id == exp_id)).all():
            claim_run(s, run_id, "w", "h", 60)
            record_result(s, run_id, _result(key, random.Random(run_id), 1, num_steps=48))
    cache: dict = {}

    def report():
        with pg_session_factory() as s:
            points = db.points.load_scaling_points(s, exp_id)
            missing = [p for p in loss_pairs(points) if numerics_key(*p) not in cache]
            ids = [i for f, b in missing for i in (*f.run_ids, *b.run_ids)]
            digests = db.points.load_run_digests(s, ids) if ids else {}
            return build_report_from_points(points, run_losses=digests, numerics_cache=cache)

    first, sql = _statements(pg_engine, report)
    pairs = [k for k in cache if k[0] != "priced"]
    assert any("digest_f64" in q for q in sql) and len(pairs) == len(first.speedups) == 3
    assert all(sp.loss_verdict is not None and sp.time_to_loss is not None for sp in first.speedups)
    again, sql = _statements(pg_engine, report)
    assert not any("digest_f64" in q or "run_loss_curves" in q for q in sql)
    assert again == first
    with pg_session_factory() as s:  # 2 precisions x 3 N x 2 repeats of seed 0: the first run of each point
        assert sorted(db.points.load_run_digests(s, run_ids)) == sorted(str(i) for i in run_ids[::2])


def test_imported_curves_get_a_verdict_and_an_effective_speedup(factory) -> None:
    """Imports store their curves as step records, not as stored curves: the digests are made from the steps."""
    import math

    from core.contracts.clusters import LOCAL_CPU
    from db.imports import ImportedSteps, insert_steps, step_chunks

    spec = make_spec(precisions=["bf16", "fp8-tensorwise"], gpu_counts=[4])
    runs, _ = expand(spec, LOCAL_CPU)
    rng = random.Random(5)

    def imported(r) -> RunResult:
        stretch = 1.0 if r.precision == "bf16" else 0.95  # fp8 gets to each loss in 95% of the steps
        res = _result(r.run_key(), rng, r.num_devices, num_steps=2)
        curve = [2.0 + 10.0 / math.sqrt(t / stretch + 10) * (1 + rng.gauss(0, 0.01)) for t in range(1000)]
        numerics = res.numerics.model_copy(update={"loss_curve": curve, "final_loss": curve[-1]})
        return res.model_copy(update={"steps": [], "numerics": numerics})

    with session_scope(factory) as s:
        results = [imported(r) for r in runs]
        exp, run_ids = record_imported(s, spec, runs, results)
        store_results(s, list(zip(run_ids, results)))
        # an import's loss curve becomes its step records: step i has loss curve[i]
        steps = [
            ImportedSteps(rows=[(i, loss, None, 0, False) for i, loss in enumerate(r.numerics.loss_curve)])
            for r in results
        ]
        for chunk in step_chunks(run_ids, steps):
            insert_steps(s, chunk)
        exp_id = exp.id
    with factory() as s:
        points = db.points.load_scaling_points(s, exp_id)
        digests = db.points.load_run_digests(s, run_ids)
    assert sorted(digests) == sorted(map(str, run_ids)) and all(d.num_steps == 1000 for d in digests.values())
    (sp,) = build_report_from_points(points, run_losses=digests).speedups
    assert (
        sp.loss_verdict in ("tracks", "differs", "inconclusive") and "no fp8 loss curve" not in sp.loss_verdict_reason
    )
    assert sp.steps_ratio == pytest.approx(0.95, abs=0.03) and sp.effective_speedup == pytest.approx(
        sp.speedup / sp.steps_ratio
    )
