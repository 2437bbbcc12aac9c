"""Pipeline parallel (pp=P+ layouts): one rank's stage of a 1F1B schedule, and what a step needs across stages.

Each rank holds one stage (runner.parallel.keep_stage: contiguous blocks, the embedding on the first stage, the
norm and output on the last). A step splits the rank's local batch into one-sequence micro-batches and runs
torch.distributed.pipelining's Schedule1F1B over them: the bubble is (P - 1) / micro-batches of the step, the
schedule the projection assumes (core.projection.step_model). The schedule averages the micro-batches' gradients
(scale_grads), so a step updates the weights as the unsplit model does with the same batch.

Only the last stage computes the loss; the first stage alone reads the tokens. Every stage of a data-parallel
rank loads the same batch (runner.data by DP rank), so inputs and labels agree without being sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from core.contracts.specs import RunSpec


def microbatches(spec: RunSpec) -> int:
    """Micro-batches per step: one sequence each."""
    return spec.local_batch_size


class Pipeline:
    """This rank's stage and its schedule; train_step and eval_loss stand in for the model's forward and backward."""

    def __init__(self, stage_module: torch.nn.Module, mesh: DeviceMesh, spec: RunSpec, device: torch.device, loss_fn):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pp_mesh = mesh["pp"]
        self.group = pp_mesh.get_group()
        self.index, self.stages = pp_mesh.get_local_rank(), spec.degrees.pp
        self.first, self.last = self.index == 0, self.index == self.stages - 1
        self.device = device
        stage = PipelineStage(stage_module, self.index, self.stages, device, group=self.group)
        self.schedule = Schedule1F1B(stage, n_microbatches=microbatches(spec), loss_fn=loss_fn)

    def count_over_stages(self, count: int) -> int:
        """The sum of a per-stage count over the pipeline (e.g. float8 linears: each stage converts its own)."""
        total = torch.tensor([count], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, group=self.group)
        return int(total.item())

    def _run(self, step, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        if self.last:
            step(*args, target=labels, losses=losses)
            return torch.stack([x.detach().float() for x in losses]).mean()
        step(*args)
        return torch.zeros((), device=self.device)  # no loss here: the reduce over ranks adds 0 (loss_ranks)

    def train_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward of the local batch; the mean micro-batch loss on the last stage, 0 elsewhere."""
        return self._run(self.schedule.step, inputs, labels)

    def eval_loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward only (no graph kept); the mean loss on the last stage, 0 elsewhere."""
        with torch.no_grad():
            return self._run(self.schedule.eval, inputs, labels)


def loss_ranks(spec: RunSpec, world_size: int) -> int:
    """Ranks that hold the loss: all of them, or under PP those of the last stage (the others add 0)."""
    return world_size // spec.degrees.pp


def clip_across_stages(params: list, max_norm: float, group) -> torch.Tensor:
    """clip_grad_norm_ over the whole model when each stage holds a part of it: the stages' squared norms are
    summed over the pipeline group before the clip factor is applied (as TorchTitan's clip_grad_norm_ with PP)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()  # the norm of this stage's whole parameters, over its data-parallel shards
    squared = norm.float() ** 2
    dist.all_reduce(squared, group=group)
    total = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total
