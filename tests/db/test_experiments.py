"""Experiment queries on PostgreSQL and SQLite: bulk create, derived status (Python and SQL agree),
keyset pagination, filters, cancel, tokens."""

from __future__ import annotations

import itertools

import pytest
import sqlalchemy as sa

import db.experiments
from db.models import RUN_STATUSES, ApiToken, Run
from db.session import session_scope
from db.tokens import create_token, hash_token, verify_token
from tests.db.helpers import add_experiment


def test_create_stores_runs_in_matrix_order(factory):
    with session_scope(factory) as s:
        exp_id, ids = add_experiment(s, gpu_counts=[1, 2, 4], precisions=["bf16", "fp8-rowwise"], repeats=2)
    with factory() as s:
        runs = db.experiments.list_runs(s, exp_id)
        assert [r.id for r in runs] == ids and len(ids) == 12
        assert [(r.precision, r.num_devices, r.repeat) for r in runs[:3]] == [
            ("bf16", 1, 0),
            ("bf16", 1, 1),
            ("bf16", 2, 0),
        ]
        assert all(r.status == "queued" and r.dispatched_at is None and r.queue == "local-cpu" for r in runs)
        assert runs[0].run_key == runs[1].run_key != runs[2].run_key  # repeats share the key
        assert runs[0].spec["degrees"]["world_size"] == 1


@pytest.mark.parametrize(
    "counts,expected",
    [
        ({}, "queued"),
        ({"queued": 3}, "queued"),
        ({"queued": 2, "running": 1}, "running"),
        ({"queued": 1, "succeeded": 1}, "running"),
        ({"pending": 1}, "running"),
        ({"succeeded": 3}, "succeeded"),
        ({"succeeded": 2, "failed": 1}, "failed"),
        ({"succeeded": 1, "cancelled": 1}, "cancelled"),
        ({"cancelled": 1, "failed": 1}, "failed"),
    ],
)
def test_derive_status(counts, expected):
    assert db.experiments.derive_status(counts) == expected


def test_sql_status_filter_agrees_with_derive_status(factory):
    """Every combination of 2 run statuses: the SQL filter finds the experiment under its derived status."""
    combos = list(itertools.combinations_with_replacement(RUN_STATUSES, 2))
    with session_scope(factory) as s:
        made = []
        for combo in combos:
            exp_id, ids = add_experiment(s, gpu_counts=[1, 2], precisions=["bf16"])
            for run_id, status in zip(ids, combo):
                s.execute(sa.update(Run).where(Run.id == run_id).values(status=status))
            made.append((exp_id, db.experiments.derive_status({st: combo.count(st) for st in combo})))
    with factory() as s:
        for status in db.experiments.EXPERIMENT_STATUSES:
            found = {e.id for e in db.experiments.list_experiments(s, limit=100, status=status)}
            assert found == {i for i, st in made if st == status}, status
        assert {i: st.status for i, st in db.experiments.statuses_for(s, [i for i, _ in made]).items()} == dict(made)


def test_keyset_pagination_and_filters(factory):
    with session_scope(factory) as s:
        ids = [add_experiment(s, tags=["nightly"] if i % 2 else ["adhoc", "x"])[0] for i in range(5)]
    with factory() as s:
        page1 = db.experiments.list_experiments(s, limit=2)
        assert [e.id for e in page1] == ids[::-1][:3]  # limit + 1 rows: a next page exists
        page2 = db.experiments.list_experiments(s, limit=2, before_id=page1[1].id)
        assert [e.id for e in page2] == ids[::-1][2:5]
        assert [e.id for e in db.experiments.list_experiments(s, tag="nightly")] == [ids[3], ids[1]]
        assert [e.id for e in db.experiments.list_experiments(s, tag="x")] == [ids[4], ids[2], ids[0]]
        assert db.experiments.list_experiments(s, tag="night") == []  # whole tags only
        assert (
            len(db.experiments.list_experiments(s, cluster="local-cpu")) == 5
            and db.experiments.list_experiments(s, cluster="h200") == []
        )


def test_cancel_cancels_queued_and_marks_running(factory):
    with session_scope(factory) as s:
        exp_id, ids = add_experiment(s)
        s.execute(sa.update(Run).where(Run.id == ids[0]).values(status="running"))
        s.execute(sa.update(Run).where(Run.id == ids[1]).values(status="succeeded"))
    with session_scope(factory) as s:
        assert db.experiments.cancel_experiment(s, exp_id) == (len(ids) - 2, 1)
        assert db.experiments.cancel_experiment(s, exp_id) == (0, 0)
    with factory() as s:
        st = db.experiments.experiment_status(s, exp_id)
        assert st.counts["cancelled"] == len(ids) - 2 and st.status == "running"
        assert s.get(Run, ids[0]).cancel_requested and not s.get(Run, ids[1]).cancel_requested


def test_tokens_store_only_the_hash(factory):
    with session_scope(factory) as s:
        token, row = create_token(s, "ci")
    with session_scope(factory) as s:
        stored = s.scalars(sa.select(ApiToken)).all()
        assert [t.token_hash for t in stored] == [hash_token(token)] and token not in stored[0].token_hash
        assert verify_token(s, token).name == "ci" and verify_token(s, token + "x") is None
        assert s.get(ApiToken, row.id).last_used_at is not None
