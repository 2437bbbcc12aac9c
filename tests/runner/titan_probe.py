"""Asks the installed TorchTitan about job configs and our train spec, in a process of its own (the tests run it).

    python -m tests.runner.titan_probe < request.json > answer.json

Request: {"tomls": {id: path}, "flavors": [name], "points": {id: {"dp_replicate", "dp_shard", "tp",
"world_size", "seq_len"}}, "data": {"flavor", "seq_len", "local_batch_size", "seed", "dp_rank"}}.
Answer: {"configs": {id: JobConfig as a dict, or {"error": text}}, "flavors": {name: {"args":
TransformerModelArgs as a dict, "num_params": parameters of TorchTitan's llama3 Transformer built on the meta
device}}, "points": {id: what ParallelDims, maybe_enable_amp and parallelize_llama's first check say},
"batch": the first (inputs, labels) of the train spec's dataloader as lists, "torchtitan": version}.

Engine parity ("parity": {"model", "num_layers", "vocab_size", "seq_len", "local_batch_size", "seed",
"dp_world_size", "dp_rank", "data_path", "steps"}): the job config TorchTitan parses for a token file; the batches
of steps 0..steps-1 as the Trainer gets them (the registered TrainSpec's build_dataloader_fn, iterated as its
batch_generator does); the model the Trainer builds (model_args updated from the job config,
the TrainSpec's model class, init_weights under no_grad, on the CPU in fp32) as {name: sha256 of its fp32 bytes};
and the mean loss of TorchTitan's loss function (sum over tokens / tokens, as forward_backward_step) on each
of those batches with those initial weights ("losses").

Everything is TorchTitan's own code (ConfigManager, the registered TrainSpec, Transformer, ParallelDims,
maybe_enable_amp, parallelize_llama) with one exception:
where Triton is not installed (CPU builds of torch come without it), the module torchtitan.models.moe.kernels
is given as a stand-in before TorchTitan is imported. TorchTitan 0.2.2's package __init__ reaches it through
the float8 converter (`import triton` and two @triton.jit MoE kernels at module level), so without Triton even
`import torchtitan.config` fails; the kernels serve MoE models only and none of this probe calls them. A
`triton` stand-in instead would make torch itself believe Triton is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types


def _kernels_stand_in() -> None:
    if importlib.util.find_spec("triton") is not None:
        return

    def needs_triton(*_args, **_kwargs):
        raise RuntimeError("torchtitan.models.moe.kernels needs Triton, which is not installed")

    module = types.ModuleType("torchtitan.models.moe.kernels")
    module.generate_permute_indices = module.fill_indices_wrapper = needs_triton
    sys.modules[module.__name__] = module


def _point(point: dict) -> dict:
    """What TorchTitan's own code says of one point (degrees, seq_len), short of building a device mesh:
    ParallelDims' validation, maybe_enable_amp (whether bf16 mixed precision is on, and by what), and the
    seq_len assertion that opens parallelize_llama (called with no model: it stops right after that check)."""
    import torch
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.utils import maybe_enable_amp
    from torchtitan.models.llama3.infra.parallelize import parallelize_llama

    try:
        dims = ParallelDims(
            dp_replicate=point["dp_replicate"],
            dp_shard=point["dp_shard"],
            cp=1,
            tp=point["tp"],
            pp=1,
            ep=1,
            etp=1,
            world_size=point["world_size"],
        )
    except AssertionError as exc:
        return {"parallel_dims_error": str(exc)}
    amp = maybe_enable_amp(dims, "bfloat16", "cuda")
    mixed_precision = "fully_shard" if dims.fsdp_enabled else "autocast" if isinstance(amp, torch.autocast) else None
    job = types.SimpleNamespace(training=types.SimpleNamespace(seq_len=point["seq_len"]))
    try:
        parallelize_llama(None, dims, job)
        seq_len_error = None
    except AssertionError as exc:
        seq_len_error = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - past the seq_len check, it needs a model and a mesh we do not build
        seq_len_error = None
    return {"parallel_dims_error": None, "mixed_precision": mixed_precision, "seq_len_error": seq_len_error}


def main() -> int:
    request = json.load(sys.stdin)
    _kernels_stand_in()
    import torch
    import torchtitan
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    from runner import titan_spec
    from runner.titan_config import MODEL_NAME, cli_args, flavor_name

    answer: dict = {"torchtitan": torchtitan.__version__, "configs": {}, "flavors": {}, "points": {}}
    for key, path in request.get("tomls", {}).items():
        try:
            config = ConfigManager().parse_args(cli_args(path))
            answer["configs"][key] = dataclasses.asdict(config)
        except BaseException as exc:  # noqa: BLE001 - the test shows what TorchTitan said (tyro exits)
            answer["configs"][key] = {"error": f"{type(exc).__name__}: {exc}"}
    spec = get_train_spec(MODEL_NAME)
    for flavor in request.get("flavors", []):
        args = spec.model_args[flavor]
        with torch.device("meta"):
            model = spec.model_cls(args)
        answer["flavors"][flavor] = {
            "args": dataclasses.asdict(args),
            "num_params": sum(p.numel() for p in model.parameters()),
        }
    for key, point in request.get("points", {}).items():
        answer["points"][key] = _point(point)
    if data := request.get("data"):
        config = ConfigManager().parse_args(
            [
                "--model.name",
                MODEL_NAME,
                "--model.flavor",
                flavor_name(data["model"], data["num_layers"]),
                "--training.dataset",
                "scalebench-synthetic",
                "--training.seq_len",
                str(data["seq_len"]),
                "--training.local_batch_size",
                str(data["local_batch_size"]),
                "--debug.seed",
                str(data["seed"]),
            ]
        )
        loader = titan_spec.build_dataloader(
            dp_world_size=data["dp_world_size"], dp_rank=data["dp_rank"], tokenizer=None, job_config=config
        )
        batches = iter(loader)
        answer["batches"] = []
        for _ in range(2):
            inputs, labels = next(batches)
            answer["batches"].append([inputs["input"].tolist(), labels.tolist()])
    if parity := request.get("parity"):
        answer["parity"] = _parity(parity)
    json.dump(answer, sys.stdout)
    return 0


def _parity(req: dict) -> dict:
    import hashlib

    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    from runner.titan_config import DATASET_FILE, MODEL_NAME, flavor_name

    flavor = flavor_name(req["model"], req["num_layers"], req["vocab_size"])
    config = ConfigManager().parse_args(
        ["--model.name", MODEL_NAME, "--model.flavor", flavor, "--training.dataset", DATASET_FILE,
         "--training.dataset_path", req["data_path"], "--training.seq_len", str(req["seq_len"]),
         "--training.local_batch_size", str(req["local_batch_size"]), "--debug.seed", str(req["seed"])]
    )  # fmt: skip
    spec = get_train_spec(MODEL_NAME)
    loader = spec.build_dataloader_fn(
        dp_world_size=req["dp_world_size"], dp_rank=req["dp_rank"], tokenizer=None, job_config=config
    )
    # As Trainer.batch_generator and train_step: iter() once, next() once a step (one micro-batch a step).
    batches = iter(loader)
    steps = [next(batches) for _ in range(req["steps"])]
    args = spec.model_args[flavor]
    args.update_from_config(config)  # as the Trainer: seq_len, and our train spec's seed
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights()
    loss_fn = spec.build_loss_fn(config)
    losses = []
    with torch.no_grad():
        for inputs, labels in steps:
            losses.append((loss_fn(model(inputs["input"]), labels) / labels.numel()).item())
    return {
        "batches": [[inputs["input"].tolist(), labels.tolist()] for inputs, labels in steps],
        "weights": {n: hashlib.sha256(p.detach().float().numpy().tobytes()).hexdigest()
                    for n, p in model.named_parameters()},
        "losses": losses,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
