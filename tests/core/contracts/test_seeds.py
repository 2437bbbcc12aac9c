"""Seeds as an axis: the matrix runs every point once per seed (and repeat); the seed is in the run key."""

from __future__ import annotations

from core.contracts.clusters import LOCAL_CPU
from core.contracts.matrix import expand
from core.contracts.specs import ExperimentSpec

BASE = dict(
    name="seeds",
    model="debug",
    num_layers=2,
    gpu_counts=[1, 2],
    precisions=["bf16", "fp8-tensorwise"],
    seq_len=16,
    steps=40,
    warmup_steps=2,
)


def test_every_point_runs_once_per_seed_and_repeat():
    runs, skipped = expand(ExperimentSpec(**BASE, seeds=[0, 1, 2], repeats=2), LOCAL_CPU)
    assert not skipped
    assert len(runs) == 2 * 2 * 3 * 2  # precisions x N x seeds x repeats
    points = {(r.precision, r.num_devices) for r in runs}
    for p in points:
        seeds = sorted(r.seed for r in runs if (r.precision, r.num_devices) == p)
        assert seeds == [0, 0, 1, 1, 2, 2]


def test_the_seed_is_in_the_run_key_and_repeats_share_it():
    runs, _ = expand(ExperimentSpec(**BASE, seeds=[0, 1], repeats=2), LOCAL_CPU)
    keys = {}
    for r in runs:
        keys.setdefault((r.precision, r.num_devices, r.seed), set()).add(r.run_key())
    assert all(len(k) == 1 for k in keys.values())  # repeats of a seed: one key
    assert len({next(iter(k)) for k in keys.values()}) == len(keys)  # seeds: different keys


def test_without_seeds_the_key_is_the_single_seed_one():
    one, _ = expand(ExperimentSpec(**BASE), LOCAL_CPU)
    listed, _ = expand(ExperimentSpec(**BASE, seeds=[0]), LOCAL_CPU)
    assert [r.run_key() for r in one] == [r.run_key() for r in listed]
    assert ExperimentSpec(**BASE).seed_list == [0]
