"""The class behind "500 on a valid-looking spec": a default never checked against the field it depends on.

Property: any body that ExperimentSpec accepts expands (runs, or a MatrixError naming every skipped point);
nothing else may be raised between validation and expansion, whichever fields are left to their defaults.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from core.contracts.clusters import LOCAL_CPU, Cluster
from core.contracts.matrix import MatrixError, expand
from core.contracts.specs import ExperimentSpec

GPU = Cluster(name="gpu", vendor="nvidia", device_name="NVIDIA H200", gpus_per_node=8, torchtitan=True)

OPTIONAL = {
    "steps": st.integers(2, 12),
    "warmup_steps": st.integers(0, 12),
    "profile_steps": st.integers(0, 5),
    "scaling": st.sampled_from(["weak", "strong"]),
    "local_batch_size": st.integers(1, 4),
    "global_batch_size": st.integers(1, 16),
    "fp8_all_gather": st.booleans(),
    "precompute_fp8_scales": st.booleans(),
    "layouts": st.lists(
        st.sampled_from(["fsdp", "ddp", "hsdp:shard=2", "tp=2", "tp=2+fsdp", "tp=3"]), min_size=1, max_size=3
    ),
    "engines": st.lists(st.sampled_from(["scalebench", "torchtitan", "command:x"]), min_size=1, max_size=2),
    "seeds": st.lists(st.integers(0, 5), min_size=1, max_size=3),
    "seed": st.integers(0, 3),
    "lr_warmup_steps": st.integers(0, 20),
    "eval_every_steps": st.integers(0, 20),
    "repeats": st.integers(1, 2),
    "seq_len": st.sampled_from([16, 48, 64]),
}


@st.composite
def bodies(draw) -> dict:
    body = {
        "name": "p",
        "model": draw(st.sampled_from(["debug", "8b"])),
        "cluster": draw(st.sampled_from(["local-cpu", "gpu"])),
        "gpu_counts": draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)),
        "precisions": draw(
            st.lists(
                st.sampled_from(["bf16", "fp8-tensorwise", "fp8-rowwise", "mxfp8-cublas", "fp32"]),
                min_size=1,
                max_size=3,
            )
        ),
    }
    for name in draw(st.sets(st.sampled_from(sorted(OPTIONAL)))):
        body[name] = draw(OPTIONAL[name])
    return body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_an_accepted_spec_always_expands_or_names_its_skips(body: dict) -> None:
    try:
        spec = ExperimentSpec.model_validate(body)
    except ValidationError:
        return  # a 422 naming the field: fine
    cluster = {"local-cpu": LOCAL_CPU, "gpu": GPU}[spec.cluster]
    try:
        runs, _ = expand(spec, cluster)
    except MatrixError as exc:
        assert exc.skipped and all(s.reason for s in exc.skipped)
        return
    assert runs and all(r.warmup_steps < r.steps for r in runs)
