"""Property-based: whatever text (lone surrogates and NUL included) and whatever finite float (the extremes
included) go into an ExperimentSpec (POST /experiments, POST /suites) or an import body, the write answers
2xx or 4xx, and every read of what was stored answers 2xx or 4xx, never 5xx. Real Postgres and Redis.

Examples are bounded (derandomized, no example database) so that the file runs in well under a minute.
"""

from __future__ import annotations

import json
import sys

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

MAX_EXAMPLES = 15
PROPS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any code point: Hypothesis leaves out surrogates unless asked for them (category Cs).
ANY_CHAR = st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]))
any_text = st.text(ANY_CHAR, max_size=12)
name_text = st.one_of(
    st.sampled_from(["n", "fp8 \u00fcber-run \U0001f680", "a\x00", "\ud800"]),
    st.text(ANY_CHAR, min_size=1, max_size=12),
)
EXTREMES = [sys.float_info.max, 1e308, 1e300, 1e-300, sys.float_info.min, 5e-324, 1.0]
positive = st.one_of(
    st.sampled_from(EXTREMES),
    st.floats(min_value=1e-3, max_value=1e9),
    st.floats(min_value=5e-324, max_value=sys.float_info.max),
)
finite = st.one_of(positive, positive.map(lambda x: -x), st.just(0.0))


def _post(client, path: str, body: dict):
    """Escaped JSON: a lone surrogate or NUL travels as \\ud800 / \\u0000 and the server decodes it back."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def _reads_answer(client, paths: list[str]) -> None:
    for path in paths:
        r = client.get(path)
        assert r.status_code < 500, (path, r.status_code, r.text[:500])
        if r.status_code == 200 and r.headers["content-type"].startswith("application/json"):
            json.loads(r.content)  # strict JSON: no Infinity, NaN or unpaired surrogate


def _experiment_reads(exp_id: int, run_ids: list[int], other_id: int | None = None) -> list[str]:
    paths = [
        f"/experiments/{exp_id}",
        f"/experiments/{exp_id}/runs",
        f"/experiments/{exp_id}/scaling",
        f"/experiments/{exp_id}/scaling?format=csv",
        f"/experiments/{exp_id}/scaling.png",
        f"/experiments/{exp_id}/losses",
        "/experiments",
    ]
    paths += [f"/runs/{i}" for i in run_ids[:2]] + [f"/runs/{i}/steps" for i in run_ids[:1]]
    if other_id is not None:
        paths.append(f"/compare?experiments={exp_id},{other_id}")
    return paths


@st.composite
def _one_wild(draw, good: dict, wild: dict) -> dict:
    """`good` with at most one field drawn from its wild strategy (so that many examples are stored and then
    read back, while every field gets arbitrary values in turn)."""
    body = {k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in good.items()}
    field = draw(st.sampled_from([None, *wild]))
    if field is not None:
        body[field] = draw(wild[field])
    return body


spec_bodies = _one_wild(
    {
        "name": name_text,
        "model": "debug",
        "cluster": "local-cpu",
        "gpu_counts": [1, 2],
        "precisions": ["bf16"],
        "steps": 4,
        "warmup_steps": 1,
        "tags": st.lists(name_text, max_size=2),
    },
    {
        "cluster": any_text,
        "layouts": st.lists(any_text, min_size=1, max_size=2),
        "lr": finite,
        "data_path": any_text,
        "name": any_text,
        "gpu_counts": st.lists(st.integers(-2, 70000), max_size=3),
        "seed": st.integers(),
        "steps": st.integers(-1, 200000),
    },
)


@PROPS
@given(body=spec_bodies)
def test_any_experiment_spec_is_stored_or_refused_and_reads_back(client, body) -> None:
    r = _post(client, "/experiments", body)
    event(f"POST /experiments: {r.status_code}")
    assert r.status_code < 500, r.text[:500]
    if r.status_code == 201:
        created = r.json()
        _reads_answer(client, _experiment_reads(created["id"], [run["id"] for run in created["runs"]]))
    else:
        assert r.status_code in (409, 422), r.text[:500]
        assert r.json()["errors"], r.text[:500]


@PROPS
@given(name=name_text, spec=spec_bodies, schedule=st.one_of(st.just("0 3 * * *"), any_text))
def test_any_suite_is_stored_or_refused_and_reads_back(client, name, spec, schedule) -> None:
    r = _post(client, "/suites", {"name": name, "spec": spec, "schedule": schedule})
    event(f"POST /suites: {r.status_code}")
    assert r.status_code < 500, r.text[:500]
    if r.status_code == 201:
        _reads_answer(client, [f"/suites/{r.json()['id']}", "/suites"])


environments = st.fixed_dictionaries(
    {},
    optional={
        "torch_version": any_text,
        "device_name": any_text,
        "driver_version": any_text,
        "hosts": st.lists(any_text, max_size=2),
        "fp8_dtypes": st.lists(any_text, max_size=2),
        "device_count": st.integers(1, 8),
    },
)
throughput = st.one_of(
    st.fixed_dictionaries({"tokens_per_sec": positive}), st.fixed_dictionaries({"tokens_per_sec_per_device": positive})
)
import_points = st.tuples(
    st.fixed_dictionaries(
        {
            "precision": st.sampled_from(["bf16", "fp8-tensorwise"]),
            "layout": st.just("fsdp"),
            "loss_curve": st.lists(finite, max_size=4),
            "environment": environments,
        },
        optional={"step_ms": positive, "peak_memory_gib": st.one_of(positive, st.just(0.0)), "final_loss": finite},
    ),
    throughput,
).map(lambda pt: pt[0] | pt[1])
import_bodies = _one_wild(
    {
        "name": name_text,
        "model": "debug",
        "cluster": "local-cpu",
        "seq_len": 256,
        "tags": st.lists(name_text, max_size=2),
        "points": st.lists(import_points, min_size=1, max_size=3).map(
            lambda ps: [p | {"num_devices": 2**i} for i, p in enumerate(ps)]
        ),
    },
    {
        "cluster": any_text,
        "device_name": any_text,
        "vendor": st.sampled_from(["nvidia", "amd", "tpu"]),
        "name": any_text,
        "tags": st.lists(any_text, max_size=2),
    },
)
REFERENCE = {
    "name": "ref",
    "model": "debug",
    "cluster": "local-cpu",
    "seq_len": 256,
    "points": [
        {"num_devices": n, "precision": p, "layout": "fsdp", "tokens_per_sec": 1000.0 * n}
        for n in (1, 2, 4)
        for p in ("bf16", "fp8-tensorwise")
    ],
}


@PROPS
@given(body=import_bodies)
def test_any_import_is_stored_or_refused_and_every_read_answers(client, body) -> None:
    reference = getattr(client, "_reference_id", None)
    if reference is None:
        reference = client._reference_id = _post(client, "/experiments/import", REFERENCE).json()["id"]
    r = _post(client, "/experiments/import", body)
    event(f"POST /experiments/import: {r.status_code}")
    assert r.status_code in (201, 422), r.text[:500]
    if r.status_code == 422:
        assert r.json()["errors"] and all(e["field"] != "body" for e in r.json()["errors"]), r.text[:500]
        return
    created = r.json()
    _reads_answer(client, _experiment_reads(created["id"], [run["id"] for run in created["runs"]], reference))
