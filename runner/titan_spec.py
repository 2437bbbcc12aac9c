"""TorchTitan train spec of engine torchtitan: TorchTitan's own llama3 with our shapes and our data.

runner.titan registers it (runner.titan_config.MODEL_NAME) before it starts the Trainer, and the job config names
this module as `experimental.custom_import` (TorchTitan's hook for user code), so the TOML alone also finds it.
Nothing in TorchTitan is edited. TorchTitan is imported inside the functions: this module imports (and
registers nothing) where TorchTitan is absent.

The spec is TorchTitan's llama3 train spec (its Transformer, parallelize_llama, AdamW, LR schedule, cross-entropy
loss) with:

- flavors `<shape>_<layers>L` built on demand from core.catalog.shapes (runner.titan_config.model_args);
- the initial weights of our runner: TorchTitan's Transformer whose init_weights, after its own (the RoPE table,
  the norms), redraws every parameter with runner.model.init_parameters from debug.seed (per-name seeded
  streams, in TorchTitan's own llama3 distribution), so both engines start from the same weights;
- a dataloader that serves runner.data's batches (the synthetic stream by seed, or the data_path file), addressed
  by (seed, step, global sequence index) exactly as our runner reads them, so both engines train on the same
  tokens; no tokenizer, no validator, no Hugging Face state-dict adapter (nothing is read or downloaded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from runner.data import Batches, MemmapTokens, SyntheticTokens
from runner.titan_config import DATASET_FILE, DATASET_SYNTHETIC, MODEL_NAME, model_args, shape_of_flavor


def _classes() -> tuple[type[Any], type[Any]]:
    """(args class, model class): TorchTitan's llama3 TransformerModelArgs and Transformer, each with the one
    addition engine parity needs (built once, on first use: TorchTitan is imported inside)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs

    from runner.model import init_parameters

    @dataclasses.dataclass
    class SeededArgs(TransformerModelArgs):
        """TransformerModelArgs that also keep the job's debug.seed (the Trainer calls update_from_config with
        the job config before it builds the model) and the core.catalog.shapes shape of the flavor."""

        init_seed: int = 0
        flavor: str = ""

        def update_from_config(self, job_config, **kwargs) -> None:
            super().update_from_config(job_config, **kwargs)
            self.init_seed = job_config.debug.seed or 0

    class SeededTransformer(Transformer):
        """TorchTitan's llama3 Transformer; init_weights runs TorchTitan's, then draws every parameter as our
        runner does (runner.model.init_parameters, seed debug.seed)."""

        def init_weights(self, buffer_device=None) -> None:
            super().init_weights(buffer_device=buffer_device)
            init_parameters(self, shape_of_flavor(self.model_args.flavor), self.model_args.init_seed)

    _CLASSES = (SeededArgs, SeededTransformer)
    return _CLASSES


_CLASSES: tuple[type[Any], type[Any]] | None = None  # (args class, model class), see _classes


def transformer_args(flavor: str):
    """TorchTitan's llama3 TransformerModelArgs of a flavor name ("8b_16L"), with the seed field (SeededArgs)."""
    from torchtitan.models.llama3.model.args import RoPEScalingArgs

    kwargs = model_args(shape_of_flavor(flavor))
    scaling = RoPEScalingArgs(scaling_factor=kwargs.pop("rope_scaling_factor"))
    args_class, _ = _classes()
    return args_class(**kwargs, rope_scaling_args=scaling, flavor=flavor)


class Flavors(Mapping):
    """train_spec.model_args: every `<shape>_<layers>L`, a fresh TransformerModelArgs per lookup (the Trainer
    updates the one it gets from the job config)."""

    def __getitem__(self, flavor: str):
        try:
            return transformer_args(flavor)
        except ValueError as exc:
            raise KeyError(str(exc)) from exc

    def __iter__(self) -> Iterator[str]:
        return iter(())  # open-ended: any shape at any layer count

    def __len__(self) -> int:
        return 0


class RunnerBatches:
    """runner.data's batches as TorchTitan's dataloader: ({"input": tokens}, labels) on the CPU, step by step
    (the Trainer moves them to the device). Its state is the next step (TorchTitan's BaseDataLoader protocol:
    an iterable with state_dict and load_state_dict)."""

    def __init__(self, batches: Batches):
        self.batches = batches
        self.step = 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            inputs, labels = self.batches.get(self.step)
            self.step += 1
            yield {"input": inputs.contiguous()}, labels.contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any) -> RunnerBatches:
    """TorchTitan's build_dataloader_fn. dp_rank: the Trainer's rank on its flattened data-parallel ("batch")
    mesh, replicate-major as our runner's mesh coordinate rep * dp_shard + shard."""
    training = job_config.training
    vocab_size = shape_of_flavor(job_config.model.flavor).vocab_size
    seed = job_config.debug.seed or 0
    if training.dataset == DATASET_FILE:
        source: Any = MemmapTokens(training.dataset_path, vocab_size, seed)
    elif training.dataset == DATASET_SYNTHETIC:
        source = SyntheticTokens(vocab_size, seed)
    else:
        raise ValueError(f"training.dataset {training.dataset!r} is not one of {DATASET_SYNTHETIC}, {DATASET_FILE}")
    batches = Batches(
        source,
        seq_len=training.seq_len,
        local_batch_size=training.local_batch_size,
        dp_rank=dp_rank,
        device=torch.device("cpu"),
    )
    return RunnerBatches(batches)


def train_spec():
    """TorchTitan's llama3 TrainSpec with our flavors, initial weights and data (no tokenizer, validator or HF
    adapter)."""
    from torchtitan.models.llama3 import get_train_spec

    return dataclasses.replace(
        get_train_spec(),
        model_cls=_classes()[1],
        model_args=Flavors(),
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=None,
        build_validator_fn=None,
        state_dict_adapter=None,
    )


def register() -> None:
    """Register MODEL_NAME once per process (TorchTitan refuses a second registration of a name)."""
    from torchtitan.protocols import train_spec as registry

    if MODEL_NAME not in registry._extra_train_specs:
        registry.register_train_spec(MODEL_NAME, train_spec())


try:  # the custom_import path: TorchTitan's Trainer imports this module by name
    register()
except ImportError:  # TorchTitan absent: runner.titan reports that (invalid_config) when it is asked to run
    pass
