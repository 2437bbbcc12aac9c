"""The projection's fitted constants, in one place: each was fitted (or calibrated) on the published scaling
results in bench/published/ by `python bench/projection_validation.py`, leave one source out; the recorded run is
bench/results/2026-12-06-projection-validation-dgxc.md, and tests/bench/test_projection_validation.py checks
that these values are the ones it printed. Refit them only by rerunning that script. CP_ATTENTION_COST is measured,
not fitted.
"""

from __future__ import annotations

from typing import Literal

# Compute units a running collective takes from the compute it overlaps (its kernels' blocks and memory bandwidth).
COLLECTIVE_UNITS = 0.0
# Achieved / nominal bus bandwidth of a ring inside a node (NVLink, Infinity Fabric) and across nodes (NICs).
INTRA_NODE_EFFICIENCY = 0.6
INTER_NODE_EFFICIENCY = 0.5
# Device-to-device speed spread (std / mean) and the shape of its slow tail: a step waits for the slowest device.
DEVICE_SPEED_CV = 0.01
STRAGGLER_TAIL: Literal["exponential", "normal"] = "exponential"

# The 80% prediction interval of a projected E(N): +- INTERVAL_Q_PP percentage points x d ** INTERVAL_EXPONENT,
# d = log2(N / N0), up to INTERVAL_VALIDATED_DOUBLINGS (the largest d of the published points); past it the
# half-width grows as a random walk, x sqrt(d / INTERVAL_VALIDATED_DOUBLINGS). q is the split-conformal 80% quantile
# of the published points' out-of-sample scores |miss| / d ** exponent; the exponent (0, 1/4 or 1/2) is the one
# with the lowest out-of-sample interval score among the shapes a plan can use (nested coverage 75-90%, at most
# 4 pp wide at 1,024 GPUs from N0 = 8).
INTERVAL_COVERAGE = 0.8
INTERVAL_Q_PP = 2.43
INTERVAL_EXPONENT = 0.0
INTERVAL_VALIDATED_DOUBLINGS = 5.0
INTERVAL_NESTED_COVERAGE = 0.80  # share of the published points inside the interval, each source left out
INTERVAL_SOURCE_MEAN_COVERAGE = 0.65  # the same, each source's share of its points, averaged over sources
# Per layout family (core.projection.model.layout_family), how many of the published points fell inside the
# interval with each source left out, of how many: the interval is calibrated on all points together, and a family
# whose share falls short of 75% is told so in its projections' notes.
INTERVAL_FAMILY_COVERAGE: dict[str, tuple[int, int]] = {
    "cp": (10, 11),
    "ddp": (2, 4),
    "fsdp": (13, 20),
    "hsdp": (2, 3),
    "pp (+tp, +cp)": (41, 46),
    "tp+fsdp": (1, 2),
}
VALIDATED_MAX_DEVICES = 16384  # the largest N of the published series; beyond it the interval extrapolates
VALIDATED_SERIES, VALIDATED_SOURCES = 46, 15  # the published set the constants were fitted and checked on
VALIDATION_MEAN_MISS_PP = 1.66  # out-of-sample mean absolute miss of E(N) over series, leave one source out

# A context-parallel rank's attention (forward + backward) over its FLOP share of the unsplit causal attention, the
# slowest rank's, measured on the scalebench runner's all-gather attention (runner.context: two lower-right causal
# SDPA calls a pass) on one H100, Llama-3 8B heads at 8,192 tokens: bench/cp_attention_gpu.py,
# bench/results/2026-12-05-gpu-h100-cp-attention-and-service.md. Other C: log-linear in C through these two.
CP_ATTENTION_COST = {2: 2.20, 4: 2.61}
