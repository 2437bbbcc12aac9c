"""Parallelism as plain functions over a model and a mesh, applied by one parallelize() in a fixed order.

Mesh: one `init_device_mesh` with named dims ("pp", "dp_replicate", "dp_shard", "cp", "tp"), sizes from
RunSpec.degrees (size-1 dims included, so every dim can be named in every layout): TP innermost, then context
parallel, data parallel, and pipeline stages outermost (TorchTitan's and Megatron's order). A rank keeps its stage
of the model (keep_stage) before the other steps, which then apply to that stage only. Context-parallel ranks hold
gradients of the same parameters, so the data-parallel wrapper spans DP x CP ranks (dp_mesh_of).

Mixed precision keeps fp32 master weights in every layout: a data-parallel wrapper (FSDP2 / HSDP /
replicate) casts parameters to bf16 through its MixedPrecisionPolicy (fp32 gradient reduction); with no
data-parallel wrapper (one DP rank, e.g. a single GPU or pure TP) the train step runs under
torch.autocast(bf16), as torchtitan does when FSDP is off.
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from core.catalog.shapes import ModelShape
from core.contracts.specs import ParallelDegrees, RunSpec
from runner.context import context_shard
from runner.fp8 import apply_float8, is_fp8
from runner.model import Block, Llama

log = logging.getLogger(__name__)

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def build_mesh(device_type: str, degrees: ParallelDegrees) -> DeviceMesh:
    shape = (degrees.pp, degrees.dp_replicate, degrees.dp_shard, degrees.cp, degrees.tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


# ------------------------------------------------------------------------------------ pipeline parallel


def stage_blocks(shape: ModelShape, pp: int, seq_len: int, stage: int, compiled: bool = False) -> range:
    """The blocks of pipeline stage `stage` of `pp`: contiguous, as ModelShape.pipeline_split weighs them (the last
    stage, which also runs the output layer and the loss, takes fewer; more so where the blocks are compiled), the
    split the projection assumes (core.projection.step_model). Needs pp <= num_layers."""
    split = shape.pipeline_split(pp, seq_len, compiled)
    start = sum(split[:stage])
    return range(start, start + split[stage])


def keep_stage(model: Llama, pp: int, stage: int, seq_len: int, compiled: bool = False) -> None:
    """Cut a (meta-device) model down to one pipeline stage in place: its blocks (named as in the whole model),
    the embedding on the first stage only, the final norm and output on the last only."""
    keep = {str(i) for i in stage_blocks(model.shape, pp, seq_len, stage, compiled)}
    for name in [n for n in model.layers if n not in keep]:
        del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < pp - 1:
        model.norm = model.output = None


def uses_dp_wrapper(degrees: ParallelDegrees) -> bool:
    """True when FSDP2/HSDP/replicate wraps the model (and owns the bf16 cast); False -> autocast. Context-parallel
    ranks need it too: their gradients are averaged like data-parallel ranks'."""
    return degrees.dp_mode != "none" and degrees.dp_degree * degrees.cp > 1


def shards_parameters(degrees: ParallelDegrees) -> bool:
    """FSDP or HSDP with more than one shard (over DP shard x CP ranks)."""
    return uses_dp_wrapper(degrees) and degrees.dp_mode != "ddp" and degrees.dp_shard * degrees.cp > 1


def param_dtype(precision: str) -> torch.dtype:
    return torch.float32 if precision == "fp32" else torch.bfloat16


# --------------------------------------------------------------------------------------- tensor parallel


def apply_tp(model: Llama, tp_mesh: DeviceMesh, *, float8_tp: bool) -> None:
    """Megatron-style TP with sequence parallel: norms and residual stream sharded on the sequence dim.

    float8_tp: torchao's Float8 styles (all-gather activations in float8). Only on CUDA with tensorwise:
    gloo cannot move float8 tensors ("Invalid scalar type"), and rowwise scales do not compose with them.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if float8_tp:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        colwise, rowwise, prepare_input = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    else:
        colwise, rowwise, prepare_input = ColwiseParallel, RowwiseParallel, PrepareModuleInput

    root_plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        # Full logits on every rank (simple cross-entropy; loss_parallel would save the gather).
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True),
    }
    # A pipeline stage holds a part of the root (or none): the hidden states it sends stay sequence-sharded.
    plan = {k: v for k, v in root_plan.items() if getattr(model, k) is not None}
    if plan:
        parallelize_module(model, tp_mesh, plan)
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": prepare_input(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
                "attention.wq": colwise(),
                "attention.wk": colwise(),
                "attention.wv": colwise(),
                "attention.wo": rowwise(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": colwise(),
                "feed_forward.w3": colwise(),
                "feed_forward.w2": rowwise(output_layouts=Shard(1)),
            },
        )
    log.info("tensor parallel over %d ranks (sequence parallel, float8 styles=%s)", tp_mesh.size(), float8_tp)


# --------------------------------------------------------------------------------------- context parallel


def apply_cp(model: Llama, mesh: DeviceMesh, seq_len: int, *, compiled: bool) -> None:
    """Context parallel over the mesh's "cp" dim: the model takes this rank's pieces of each sequence
    (runner.context.ContextShard.local) and its attention gathers the other ranks' keys and values."""
    shard = context_shard(mesh, seq_len, compiled=compiled)
    model.context = shard
    for block in model.layers.values():
        assert isinstance(block, Block)  # before activation checkpointing and compile wrap the blocks
        block.attention.context = shard
    log.info("context parallel over %d ranks (pieces %s of %d)", shard.size, shard.pieces, 2 * shard.size)


# ------------------------------------------------------------------------------ checkpointing, compile


def apply_ac(model: Llama) -> None:
    """Full activation checkpointing per block: recompute the block's forward in backward (~+33% FLOPs)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in model.layers.items():
        model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: Llama) -> None:
    """torch.compile each block (identical blocks share one compiled graph: compile time ~ one block)."""
    # Context parallel's attention runs eagerly (runner.context.ContextShard.attention): a graph break per block.
    fullgraph = model.context is None
    for name, block in model.layers.items():
        model.layers[name] = torch.compile(block, fullgraph=fullgraph)  # type: ignore[assignment]  # a Module's is a Module


# ------------------------------------------------------------------------------------ data parallel


def dp_mesh_of(mesh: DeviceMesh, degrees: ParallelDegrees) -> DeviceMesh:
    """The data-parallel wrapper's mesh: its DP dims, with the CP dim folded into the shard (or, for DDP, the
    replicate) dim where cp > 1 (TorchTitan's dp_shard_cp)."""
    if degrees.cp > 1:
        inner = "dp_replicate" if degrees.dp_mode == "ddp" else "dp_shard"
        mesh[inner, "cp"]._flatten(f"{inner}_cp")  # registers the flattened dim on the root mesh
        if degrees.dp_mode == "hsdp":
            return mesh["dp_replicate", "dp_shard_cp"]
        return mesh[f"{inner}_cp"]
    if degrees.dp_mode == "hsdp":
        return mesh["dp_replicate", "dp_shard"]  # 2-D: replicate across groups, shard within
    if degrees.dp_mode == "ddp":
        return mesh["dp_replicate"]
    return mesh["dp_shard"]


def apply_fsdp(model: Llama, dp_mesh: DeviceMesh, precision: str, *, reshard_after_forward: bool) -> None:
    """FSDP2 (1-D mesh) or HSDP (2-D mesh): one unit per block (norms included) plus the root.

    Block-level units matter on CPU too: a unit made only of float8 weights cannot be all-gathered by gloo.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype(precision), reduce_dtype=torch.float32)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them gathered.
        last = i == len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: Llama, dp_mesh: DeviceMesh, precision: str) -> None:
    """DDP through FSDP2's replicate (works on meta-device models, same mixed-precision policy)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=param_dtype(precision), reduce_dtype=torch.float32)
    for name, block in model.layers.items():
        model.layers[name] = replicate(block, mesh=dp_mesh, mp_policy=mp)  # type: ignore[assignment]  # the Module, wrapped
    replicate(model, mesh=dp_mesh, mp_policy=mp)


# ------------------------------------------------------------------------------------------ the order


def parallelize(model: Llama, mesh: DeviceMesh, spec: RunSpec) -> dict:
    """Convert and wrap a meta-device model in place. Returns facts for the result (fp8 config, count)."""
    degrees, device_type = spec.degrees, spec.device_type
    facts: dict = {"fp8_config": None, "num_float8_linears": None}
    # 0. pipeline parallel: this rank's stage only (the steps below see only its blocks and root modules).
    if degrees.pp > 1:
        keep_stage(model, degrees.pp, mesh["pp"].get_local_rank(), spec.seq_len, compiled=spec.compile)
    # 1. float8 first: TP and FSDP must see Float8Linear modules to pick their float8-aware paths.
    if is_fp8(spec.precision):
        fp8_all_gather = spec.fp8_all_gather and shards_parameters(degrees)
        if spec.fp8_all_gather and not fp8_all_gather:
            log.warning("fp8_all_gather ignored: no FSDP sharding in this layout (%s)", spec.layout)
        config, n = apply_float8(model, spec.precision, emulate=device_type == "cpu", fp8_all_gather=fp8_all_gather)
        facts.update(fp8_config=config, num_float8_linears=n, fp8_all_gather=fp8_all_gather)
    # 1b. context parallel: attention modules learn their rank's pieces (before any wrapper hides them).
    if degrees.cp > 1:
        apply_cp(model, mesh, spec.seq_len, compiled=spec.compile)
    # 2. tensor parallel on the innermost mesh dim (fastest links).
    if degrees.tp > 1:
        float8_tp = spec.precision == "fp8-tensorwise" and device_type == "cuda"
        apply_tp(model, mesh["tp"], float8_tp=float8_tp)
    # 3. activation checkpointing wraps each block before compile, so the recompute is compiled too.
    if spec.activation_checkpointing == "full":
        apply_ac(model)
    # 4. compile each block (FSDP hooks stay outside the compiled graphs).
    if spec.compile:
        apply_compile(model)
    # 5. data parallel last: it shards whatever parameters the steps above produced (DTensors under TP).
    if uses_dp_wrapper(degrees):
        dp_mesh = dp_mesh_of(mesh, degrees)
        if degrees.dp_mode == "ddp":
            apply_ddp(model, dp_mesh, spec.precision)
        else:
            # Under PP a stage runs several micro-batches' forwards before their backwards: keep the parameters
            # gathered between them rather than gather them per micro-batch (TorchTitan's default policy).
            apply_fsdp(model, dp_mesh, spec.precision, reshard_after_forward=degrees.pp == 1)
        log.info("%s over mesh %s", degrees.dp_mode, dict(zip(dp_mesh.mesh_dim_names or (), dp_mesh.shape)))
    return facts
