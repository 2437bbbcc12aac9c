"""runner.titan_config against TorchTitan 0.2.2's own ConfigManager, and the torchtitan refusals.

Every layout (fsdp, ddp, hsdp:shard=2, tp=2, tp=2+fsdp) x precision (bf16 and the three float8 recipes) at
N = 1, 2, 4, 8: a point TorchTitan can run gets a TOML that TorchTitan's ConfigManager parses into exactly the
RunSpec's degrees, recipe, sequence length, batch, steps, compile, activation checkpointing and fp8 all-gather;
a point it cannot run is refused with one reason by runner.titan_config (the run) and
core.engines.registry.engine_reason (POST time), and the refusals agree with TorchTitan's own ParallelDims,
maybe_enable_amp and parallelize_llama checks. TorchTitan is asked in one subprocess (tests/runner/titan_probe.py,
a few seconds); without the `torchtitan` package (the dev extra installs it) those tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys

import pytest

from core.catalog.shapes import get_shape
from core.contracts.clusters import Cluster
from core.contracts.specs import RunSpec, resolve_layout
from core.engines.registry import engine_reason, torchtitan_point_reason
from runner import titan_config
from tests.runner.conftest import REPO

LAYOUTS = ("fsdp", "ddp", "hsdp:shard=2", "tp=2", "tp=2+fsdp")
PRECISIONS = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp")
COUNTS = (1, 2, 4, 8)
H200 = Cluster(name="h200", vendor="nvidia", device_name="NVIDIA H200", gpus_per_node=8, max_nodes=2, torchtitan=True)
HAVE_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None
needs_torchtitan = pytest.mark.skipif(
    not HAVE_TORCHTITAN, reason="torchtitan is not installed (pip install -e '.[dev]' installs torchtitan 0.2.2)"
)


def gpu_spec(precision: str, layout: str, n: int, **overrides) -> RunSpec:
    i = COUNTS.index(n) + (LAYOUTS.index(layout) if layout in LAYOUTS else 0)  # vary compile and AC across the grid
    kw = dict(
        model="8b",
        num_layers=4,
        precision=precision,
        layout=layout,
        degrees=resolve_layout(layout, n),
        scaling="weak",
        seq_len=2048 * (1 + i % 2),
        local_batch_size=1 + i % 3,
        steps=20 + n,
        warmup_steps=5,
        compile=i % 2 == 0,
        activation_checkpointing="full" if i % 3 == 0 else "none",
        fp8_all_gather=precision == "fp8-tensorwise" and layout in ("fsdp", "hsdp:shard=2") and i % 2 == 0,
        lr=2e-4,
        lr_warmup_steps=3,
        lr_schedule="cosine" if i % 2 else "constant",
        vocab_size=32000 if i % 4 == 1 else None,
        seed=11 + n,
        device_type="cuda",
        cluster="h200",
    )
    kw["precompute_fp8_scales"] = kw["fp8_all_gather"]
    kw.update(overrides)
    return RunSpec(**kw)


def grid() -> list[RunSpec]:
    specs = []
    for precision, layout, n in itertools.product(PRECISIONS, LAYOUTS, COUNTS):
        try:
            resolve_layout(layout, n)
        except ValueError:
            continue  # not a point of the matrix (hsdp:shard=2 at N=1, tp=2 at N != 2)
        specs.append(gpu_spec(precision, layout, n))
    return specs


def key(spec: RunSpec) -> str:
    return f"{spec.precision}/{spec.layout}/N={spec.num_devices}" + (
        "" if spec.seq_len in (2048, 4096) else f"/seq={spec.seq_len}"
    )


def seq_len_points() -> list[RunSpec]:
    """Sequence lengths on either side of TorchTitan's divisor (2 x tp)."""
    return [
        gpu_spec("bf16", "tp=2+fsdp", 4, seq_len=2050),
        gpu_spec("bf16", "tp=2+fsdp", 4, seq_len=2052),
        gpu_spec("fp8-rowwise", "tp=2+fsdp", 8, seq_len=2054),
        gpu_spec("bf16", "fsdp", 2, seq_len=2049),
        gpu_spec("bf16", "ddp", 4, seq_len=2050),
    ]


def titan_point(spec: RunSpec) -> dict[str, int]:
    d = spec.degrees
    return dict(
        dp_replicate=d.dp_replicate, dp_shard=d.dp_shard, tp=d.tp, world_size=d.world_size, seq_len=spec.seq_len
    )


def titan_refusal(answer: dict) -> str | None:
    """Why TorchTitan's own code refuses a point or cannot run it as we mean it (bf16 mixed precision), or None."""
    if answer["parallel_dims_error"]:
        return f"ParallelDims: {answer['parallel_dims_error']}"
    if answer["mixed_precision"] is None:
        return "maybe_enable_amp: mixed precision off"
    return answer["seq_len_error"]


@pytest.fixture(scope="module")
def titan(tmp_path_factory) -> dict:
    """TorchTitan's parse of every runnable point of the grid, our debug and 8b flavors, and two batches."""
    if not HAVE_TORCHTITAN:
        pytest.skip("torchtitan is not installed (pip install -e '.[dev]' installs torchtitan 0.2.2)")
    root = tmp_path_factory.mktemp("titan")
    tomls = {}
    for spec in grid():
        if titan_config.run_reason(spec) is None:
            path = root / f"{len(tomls)}.toml"
            path.write_text(titan_config.job_toml(spec, dump_folder=str(root / "dump")))
            tomls[key(spec)] = str(path)
    request = {
        "tomls": tomls,
        "points": {key(spec): titan_point(spec) for spec in grid() + seq_len_points()},
        "flavors": ["debug_2L", "8b_4L", "1b_16L", "1b_2L_v23000"],
        "data": {
            "model": "debug",
            "num_layers": 2,
            "seq_len": 32,
            "local_batch_size": 2,
            "seed": 7,
            "dp_world_size": 2,
            "dp_rank": 1,
        },
    }
    out = subprocess.run(
        [sys.executable, "-m", "tests.runner.titan_probe"],
        input=json.dumps(request),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


# --------------------------------------------------------------------------------------------- refusals


def test_the_grid_has_runnable_and_refused_points():
    reasons = {key(s): titan_config.run_reason(s) for s in grid()}
    runnable = [k for k, r in reasons.items() if r is None]
    assert len(runnable) >= 40 and len(reasons) - len(runnable) >= 8
    # TP without FSDP sharding: TorchTitan turns mixed precision off (maybe_enable_amp) -> refused
    assert "mixed precision off" in reasons["bf16/tp=2/N=2"]
    assert "mixed precision off" in reasons["fp8-rowwise/tp=2+fsdp/N=2"]
    # float8 with TP and FSDP runs for every recipe in TorchTitan 0.2.2, rowwise included
    assert reasons["fp8-rowwise/tp=2+fsdp/N=4"] is None and reasons["fp8-rowwise-gw-hp/tp=2+fsdp/N=8"] is None


@needs_torchtitan
@pytest.mark.parametrize("spec", grid() + seq_len_points(), ids=key)
def test_a_point_we_refuse_is_one_torchtitan_refuses(titan, spec):
    """Against TorchTitan 0.2.2's own code (ParallelDims, maybe_enable_amp, parallelize_llama's seq_len check,
    run by tests/runner/titan_probe.py): a point runner.titan_config refuses is one TorchTitan refuses or would
    train otherwise than we mean (fp32 instead of bf16 mixed precision), and a point it accepts TorchTitan runs."""
    ours = titan_config.run_reason(spec)
    theirs = titan_refusal(titan["points"][key(spec)])
    assert (ours is None) == (theirs is None), (ours, theirs)
    if theirs is not None and "mixed precision off" in theirs:
        assert "mixed precision off" in ours
    if theirs is not None and "Sequence length" in theirs:
        assert "seq_len divisible by 2 x tp" in ours


@pytest.mark.parametrize("spec", grid(), ids=key)
def test_titan_config_and_engine_reason_give_one_verdict(spec):
    """The run and POST time refuse through one rule; this checks the wiring (same arguments, same text), not the
    rule: test_a_point_we_refuse_is_one_torchtitan_refuses checks the rule against TorchTitan."""
    reason = titan_config.run_reason(spec)
    post = engine_reason(
        "torchtitan",
        H200,
        spec.precision,
        spec.layout,
        spec.degrees,
        seq_len=spec.seq_len,
        eval_every_steps=spec.eval_every_steps,
    )
    assert post == reason
    if reason is None:
        titan_config.job_toml(spec, dump_folder="/tmp/x")
    else:
        with pytest.raises(ValueError) as info:
            titan_config.job_toml(spec, dump_folder="/tmp/x")
        assert str(info.value) == reason


@pytest.mark.parametrize(
    ("precision", "layout", "n", "overrides", "words"),
    [
        ("fp32", "fsdp", 2, {}, "torchtitan runs bf16, fp8-tensorwise, fp8-rowwise, fp8-rowwise-gw-hp, not fp32"),
        ("mxfp8-cublas", "fsdp", 2, {}, "MX recipes through TorchTitan are not supported"),
        ("bf16", "tp=2", 2, {}, "tp=2, dp_shard=1"),
        ("bf16", "tp=2+fsdp", 4, {"seq_len": 2050}, "seq_len divisible by 2 x tp (4), not 2050"),
        ("bf16", "fsdp", 2, {"eval_every_steps": 5}, "set eval_every_steps 0 for engine torchtitan"),
        ("bf16", "fsdp", 2, {"device_type": "cpu"}, "not on the CPU"),
        ("bf16", "pp=2+fsdp", 4, {}, "without pipeline or context parallelism (pp=2, cp=1)"),
    ],
)
def test_unsupported_points_are_refused_with_the_reason_by_both(precision, layout, n, overrides, words):
    spec = gpu_spec(precision, layout, n, fp8_all_gather=False, precompute_fp8_scales=False, **overrides)
    reason = titan_config.run_reason(spec)
    assert reason is not None and words in reason
    with pytest.raises(ValueError, match="torchtitan"):
        titan_config.job_sections(spec, dump_folder="/tmp/x")
    cluster = (
        H200
        if spec.device_type == "cuda"
        else Cluster(name="cpu", vendor="cpu", device_name="cpu", gpus_per_node=4, torchtitan=True)
    )
    assert (
        engine_reason(
            "torchtitan",
            cluster,
            precision,
            layout,
            spec.degrees,
            seq_len=spec.seq_len,
            eval_every_steps=spec.eval_every_steps,
        )
        == reason
    )
    # the API files an engine's refusal under `engines` by its first word (api/routers/experiments.py)
    assert reason.startswith("torchtitan ")


def test_engine_reason_without_the_run_fields_judges_the_point_alone():
    degrees = resolve_layout("tp=2+fsdp", 4)
    assert engine_reason("torchtitan", H200, "fp8-rowwise", "tp=2+fsdp", degrees) is None
    assert torchtitan_point_reason("fp8-rowwise", degrees, "cuda", seq_len=30) is not None


# ------------------------------------------------------------------------------ TorchTitan's own parse


@needs_torchtitan
@pytest.mark.parametrize("spec", [s for s in grid() if titan_config.run_reason(s) is None], ids=key)
def test_torchtitan_parses_the_job_as_the_run_spec_says(titan, spec):
    config = titan["configs"][key(spec)]
    assert "error" not in config, config.get("error")
    d, p, t = spec.degrees, config["parallelism"], config["training"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"], p["tensor_parallel_degree"]) == (
        d.dp_replicate,
        d.dp_shard,
        d.tp,
    )
    assert (p["context_parallel_degree"], p["pipeline_parallel_degree"]) == (1, 1)
    assert (t["seq_len"], t["local_batch_size"], t["global_batch_size"], t["steps"]) == (
        spec.seq_len,
        spec.local_batch_size,
        spec.global_batch_size,
        spec.steps,
    )
    assert (t["dtype"], t["mixed_precision_param"], t["max_norm"]) == ("float32", "bfloat16", 1.0)
    assert t["dataset"] == "scalebench-synthetic"
    assert config["compile"]["enable"] is spec.compile and config["compile"]["components"] == ["model", "loss"]
    assert config["activation_checkpoint"]["mode"] == spec.activation_checkpointing
    assert config["optimizer"]["lr"] == spec.lr and config["optimizer"]["implementation"] == "fused"
    lr = config["lr_scheduler"]
    assert lr["warmup_steps"] == spec.lr_warmup_steps
    if spec.lr_schedule == "constant":  # no decay steps after the warm-up
        assert lr["decay_ratio"] == 0.0
    else:  # cosine over every step after the warm-up, to 10% (runner.train.lr_factor)
        assert (lr["decay_ratio"], lr["decay_type"], lr["min_lr_factor"]) == (None, "cosine", 0.1)
    assert config["debug"]["seed"] == spec.seed
    assert config["checkpoint"]["enable"] is False and config["validation"]["enable"] is False
    assert config["model"]["name"] == titan_config.MODEL_NAME
    assert config["model"]["flavor"] == f"8b_{spec.num_layers}L" + (f"_v{spec.vocab_size}" if spec.vocab_size else "")
    assert config["experimental"]["custom_import"] == "runner.titan_spec"
    float8 = config["quantize"]["linear"]["float8"]
    if spec.precision == "bf16":
        assert config["model"]["converters"] == []
    else:
        assert config["model"]["converters"] == ["quantize.linear.float8"]
        # tensorwise: TorchTitan's default float8 path (no recipe name), the one that takes the fp8 all-gather
        assert (
            float8["recipe_name"]
            == {"fp8-tensorwise": None, "fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp"}[
                spec.precision
            ]
        )
        assert float8["filter_fqns"] == ["output"] and float8["emulate"] is False
    assert float8["enable_fsdp_float8_all_gather"] is spec.fp8_all_gather
    assert float8["precompute_float8_dynamic_scale_for_fsdp"] is spec.precompute_fp8_scales


@needs_torchtitan
def test_the_grid_covers_fp8_all_gather_compile_and_ac(titan):
    parsed = list(titan["configs"].values())
    assert any(c["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] for c in parsed)
    assert {c["compile"]["enable"] for c in parsed} == {True, False}
    assert {c["activation_checkpoint"]["mode"] for c in parsed} == {"none", "full"}
    assert {c["lr_scheduler"]["decay_type"] for c in parsed} == {"linear", "cosine"}
    assert any(c["model"]["flavor"].endswith("_v32000") for c in parsed)
    assert titan["torchtitan"] == titan_config.TORCHTITAN_VERSION


@needs_torchtitan
@pytest.mark.parametrize("flavor", ["debug_2L", "8b_4L", "1b_16L", "1b_2L_v23000"])
def test_torchtitan_builds_our_shape(titan, flavor):
    """TorchTitan's llama3 Transformer of our flavor has the shape's dimensions and exactly its parameters."""
    shape = titan_config.shape_of_flavor(flavor)
    got = titan["flavors"][flavor]
    assert got["num_params"] == shape.num_params()
    args = got["args"]
    assert (args["dim"], args["n_layers"], args["n_heads"], args["n_kv_heads"], args["vocab_size"]) == (
        shape.dim,
        shape.num_layers,
        shape.num_heads,
        shape.num_kv_heads,
        shape.vocab_size,
    )
    assert args["rope_theta"] == shape.rope_theta and args["rope_scaling_args"]["scaling_factor"] == 1.0


@needs_torchtitan
def test_the_train_spec_serves_the_batches_our_runner_reads(titan):
    import torch

    from runner.data import make_batches

    spec = RunSpec(
        model="debug",
        num_layers=2,
        precision="bf16",
        layout="fsdp",
        degrees=resolve_layout("fsdp", 2),
        scaling="weak",
        seq_len=32,
        local_batch_size=2,
        steps=4,
        warmup_steps=1,
        seed=7,
    )
    ours = make_batches(spec, get_shape("debug").vocab_size, dp_rank=1, device=torch.device("cpu"))
    for step, (inputs, labels) in enumerate(titan["batches"]):
        expected_inputs, expected_labels = ours.get(step)
        assert inputs == expected_inputs.tolist() and labels == expected_labels.tolist()


# ----------------------------------------------------------------------------------------- no TorchTitan


def test_flavor_names_round_trip_and_refuse_unknown_shapes():
    assert titan_config.flavor_name("8b", 16) == "8b_16L"
    assert titan_config.shape_of_flavor("8b_16L") == get_shape("8b", 16)
    assert titan_config.flavor_name("1b", 2, 23000) == "1b_2L_v23000"
    assert titan_config.shape_of_flavor("1b_2L_v23000") == get_shape("1b", 2, 23000)
    with pytest.raises(ValueError, match="debug, 1b, 8b, 70b, 405b"):
        titan_config.shape_of_flavor("9b_2L")


def test_toml_renders_strings_lists_and_dotted_tables():
    text = titan_config.render_toml(
        {"a": {"s": 'x"y', "l": ["p", "q"], "b": True, "f": 1e-08}, "quantize.linear.float8": {"n": 3}}
    )
    import tomllib

    assert tomllib.loads(text) == {
        "a": {"s": 'x"y', "l": ["p", "q"], "b": True, "f": 1e-08},
        "quantize": {"linear": {"float8": {"n": 3}}},
    }


def test_runner_titan_reports_a_missing_torchtitan_as_invalid_config(tmp_path):
    """`python -m runner.titan` where TorchTitan does not import: a failed result, kind invalid_config."""
    spec = gpu_spec("bf16", "fsdp", 1)
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    hide = tmp_path / "hide"  # a `torchtitan` that is not there: a package whose import fails as absent
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\nclass _NoTitan:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torchtitan' or name.startswith('torchtitan.'):\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "sys.meta_path.insert(0, _NoTitan())\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{hide}:{REPO}", "SCALEBENCH_LOG_LEVEL": "WARNING"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.titan",
            "--spec",
            str(tmp_path / "spec.json"),
            "--out",
            str(tmp_path / "result.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed" and result["run_key"] == spec.run_key()
    assert result["error"]["kind"] == "invalid_config"
    assert result["error"]["message"].endswith("torchtitan is not installed on this node: pip install '.[torchtitan]'")


def test_runner_titan_refuses_a_point_torchtitan_cannot_run(tmp_path):
    spec = gpu_spec("bf16", "tp=2", 2)
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.titan",
            "--spec",
            str(tmp_path / "spec.json"),
            "--out",
            str(tmp_path / "result.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SCALEBENCH_LOG_LEVEL": "WARNING"},
    )
    assert out.returncode == 1, out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    if not HAVE_TORCHTITAN:
        assert result["error"]["message"].endswith("pip install '.[torchtitan]'")
        return
    assert result["error"]["kind"] == "invalid_config"
    assert result["error"]["message"].endswith(titan_config.run_reason(spec))
