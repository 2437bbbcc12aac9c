"""torchao float8 training: recipe -> Float8LinearConfig, module conversion, dtype reporting.

Recipes (core.specs.FP8_PRECISIONS): fp8-tensorwise (one scale per tensor; the only recipe whose weights
FSDP can all-gather in float8), fp8-rowwise (one scale per row, more accurate, costlier casts),
fp8-rowwise-gw-hp (rowwise, but the weight gradient GEMM stays in high precision).
"""

from __future__ import annotations

import logging

from torch import nn

log = logging.getLogger(__name__)

TORCHAO_RECIPES = {"fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp"}


def is_fp8(precision: str) -> bool:
    return precision.startswith("fp8")


def float8_config(precision: str, *, emulate: bool, fp8_all_gather: bool):
    """The torchao Float8LinearConfig for a precision name (ValueError names the allowed ones)."""
    from torchao.float8 import Float8LinearConfig

    if precision == "fp8-tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_all_gather, emulate=emulate)
    if precision in TORCHAO_RECIPES:
        if fp8_all_gather:
            raise ValueError(f"fp8_all_gather works only with fp8-tensorwise, not {precision}")
        base = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[precision])
        # from_recipe_name has no emulate argument; the config is a frozen dataclass.
        import dataclasses

        return dataclasses.replace(base, emulate=emulate)
    raise ValueError(f"precision {precision!r} is not a float8 recipe; allowed: fp8-tensorwise, "
                     f"{', '.join(TORCHAO_RECIPES)}")


def fp8_module_filter(module: nn.Module, fqn: str) -> bool:
    """Convert a Linear unless it is the output layer or a dim is not divisible by 16 (fp8 GEMM tiles)."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn == "output" or fqn.endswith(".output"):
        return False  # the vocab projection: precision-sensitive and kept in bf16 (torchtitan does too)
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, precision: str, *, emulate: bool, fp8_all_gather: bool):
    """Swap eligible nn.Linear for torchao Float8Linear in place. Returns (config, number converted)."""
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = float8_config(precision, emulate=emulate, fp8_all_gather=fp8_all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=fp8_module_filter)
    num_converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    num_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    log.info("float8 %s: converted %d of %d Linear modules (emulate=%s, fp8_all_gather=%s)",
             precision, num_converted, num_linear, emulate, fp8_all_gather)
    return config, num_converted


def fp8_dtypes_of_config(config) -> list[str]:
    """The float8 dtypes a Float8LinearConfig casts to (casts that are disabled contribute nothing)."""
    from torchao.float8.config import ScalingType

    casts = (config.cast_config_input, config.cast_config_input_for_grad_weight, config.cast_config_weight,
             config.cast_config_weight_for_grad_input, config.cast_config_grad_output,
             config.cast_config_grad_output_for_grad_weight)
    names = {str(c.target_dtype).removeprefix("torch.") for c in casts
             if c.scaling_type != ScalingType.DISABLED and c.target_dtype is not None}
    return sorted(names)


def precompute_fp8_scales(model: nn.Module) -> None:
    """After optimizer.step(): one fused amax over all fp8 weights for the next FSDP fp8 all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
