"""Engine parity on the CPU: TorchTitan's path (engine torchtitan) and our runner's see the same token batches at
the same steps from a token file, start from the same weights, and so score the same first losses.

TorchTitan is asked in a subprocess (tests/runner/titan_probe.py's "parity" request: its ConfigManager, the
registered TrainSpec's dataloader, model class, init_weights and loss function); our side is runner.data and
runner.model as runner.train uses them. TorchTitan's Trainer itself needs a GPU (core.engines.registry refuses
engine torchtitan on the CPU), so the optimizer steps are compared on the GPU: bench/time_to_loss_gpu.py,
bench/results/2026-12-04-time-to-loss-h200.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from core.catalog.shapes import get_shape
from runner.data import make_batches
from runner.model import Llama, init_weights
from runner.train import cross_entropy_fp32
from tests.runner.conftest import REPO, make_spec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None,
    reason="torchtitan is not installed (pip install -e '.[dev]' installs torchtitan 0.2.2)",
)

STEPS = 4
SEED = 7


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> tuple[dict, object]:
    """TorchTitan's answer and our RunSpec for one token file, rank 1 of 2 data-parallel ranks."""
    root = tmp_path_factory.mktemp("parity")
    data = root / "tokens.bin"
    vocab = get_shape("debug").vocab_size
    np.random.default_rng(3).integers(0, vocab, size=5000, dtype=np.uint16).tofile(data)
    spec = make_spec("bf16", "fsdp", 2, data_path=data.name, data_roots=[str(root)], seed=SEED, local_batch_size=2)
    request = {
        "parity": {
            "model": spec.model,
            "num_layers": spec.num_layers,
            "vocab_size": None,
            "seq_len": spec.seq_len,
            "local_batch_size": spec.local_batch_size,
            "seed": SEED,
            "dp_world_size": 2,
            "dp_rank": 1,
            "data_path": str(data),
            "steps": STEPS,
        }
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
    return json.loads(out.stdout)["parity"], spec


def test_both_engines_train_on_the_same_batches_at_the_same_steps(parity):
    titan, spec = parity
    ours = make_batches(spec, spec.shape.vocab_size, dp_rank=1, device=torch.device("cpu"))
    assert len(titan["batches"]) == STEPS
    seen = set()
    for step, (inputs, labels) in enumerate(titan["batches"]):
        expected_inputs, expected_labels = ours.get(step)
        assert inputs == expected_inputs.tolist(), f"step {step}: inputs differ"
        assert labels == expected_labels.tolist(), f"step {step}: labels differ"
        seen.add(json.dumps(inputs))
    assert len(seen) == STEPS  # a new batch every step, not one batch repeated


def test_both_engines_start_from_the_same_weights_and_losses(parity):
    titan, spec = parity
    model = Llama(spec.shape, max_seq_len=spec.seq_len)
    init_weights(model, SEED)
    ours = {n: hashlib.sha256(p.detach().float().numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}
    assert ours == titan["weights"]
    other = Llama(spec.shape, max_seq_len=spec.seq_len)
    init_weights(other, SEED + 1)
    assert (
        hashlib.sha256(other.output.weight.detach().numpy().tobytes()).hexdigest() != titan["weights"]["output.weight"]
    )
    batches = make_batches(spec, spec.shape.vocab_size, dp_rank=1, device=torch.device("cpu"))
    with torch.no_grad():
        losses = [cross_entropy_fp32(model(inputs), labels).item() for inputs, labels in map(batches.get, range(STEPS))]
    # Same weights and tokens; the two models' fp32 arithmetic differs only in operation order (RMSNorm, GQA).
    assert losses == pytest.approx(titan["losses"], rel=1e-5)
    assert max(losses) - min(losses) > 1e-4  # the batches differ, so do their losses
