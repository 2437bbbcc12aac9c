"""torchao 8-bit float training: recipe -> config, module conversion, dtype reporting.

float8 recipes (core.contracts.specs.FLOAT8_PRECISIONS, torchao.float8): fp8-tensorwise (one scale per tensor; the only
recipe whose weights FSDP can all-gather in float8), fp8-rowwise (one scale per row, more accurate, costlier
casts), fp8-rowwise-gw-hp (rowwise, but the weight gradient GEMM stays in high precision).

MX recipes (core.contracts.specs.MX_PRECISIONS, torchao 0.18's MXFP8 training in torchao.prototype.moe_training): e4m3
elements with one e8m0 scale per 32 consecutive elements, in all three GEMMs of a Linear. mxfp8-cublas and
mxfp8-cublas-floor need MX tensor cores (core.catalog.hardware); mxfp8-emulated, and every MX recipe on CPU, quantize
and dequantize and multiply in bf16.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from core.contracts.specs import FP8_PRECISIONS, MX_PRECISIONS

log = logging.getLogger(__name__)

TORCHAO_RECIPES = {"fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp"}
MX_BLOCK_SIZE = 32  # elements per e8m0 scale, along the reduction dim of every GEMM


@dataclasses.dataclass(frozen=True)
class MXRecipe:
    """What torchao's MXFP8TrainingOpConfig recipes set for a Linear (kernels, scale rounding, wgrad precision)."""

    precision: str
    kernel: str  # "auto" (torchao's cast kernels + block-scaled cuBLAS GEMM) or "emulated"
    scale_mode: str  # "rceil" or "floor" (torchao.prototype.mx_formats.config.ScaleCalculationMode values)
    wgrad_with_hp: bool = False


MX_RECIPES = {
    "mxfp8-cublas": MXRecipe("mxfp8-cublas", "auto", "rceil"),  # torchao 0.18 recipe mxfp8_rceil
    "mxfp8-cublas-floor": MXRecipe("mxfp8-cublas-floor", "auto", "floor"),
    "mxfp8-emulated": MXRecipe("mxfp8-emulated", "emulated", "rceil"),  # recipe mxfp8_emulated_rceil
}
assert set(MX_RECIPES) == set(MX_PRECISIONS)


def is_fp8(precision: str) -> bool:
    """Any 8-bit float recipe: torchao float8 or MX."""
    return precision in FP8_PRECISIONS


def is_mx(precision: str) -> bool:
    return precision in MX_PRECISIONS


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
    raise ValueError(
        f"precision {precision!r} is not a float8 recipe; allowed: fp8-tensorwise, {', '.join(TORCHAO_RECIPES)}"
    )


# The output layer (the vocab projection) stays in bf16, as TorchTitan's Llama-3 configs filter it. A switch for the
# GPU bench's A/B runs (what converting it would give, and at what loss).
CONVERT_OUTPUT_LAYER = False


def fp8_module_filter(module: nn.Module, fqn: str) -> bool:
    """Convert a Linear unless it is the output layer or a dim is not divisible by 16 (fp8 GEMM tiles)."""
    if not isinstance(module, nn.Linear):
        return False
    if (fqn == "output" or fqn.endswith(".output")) and not CONVERT_OUTPUT_LAYER:
        return False  # the vocab projection: precision-sensitive and kept in bf16 (torchtitan does too)
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, precision: str, *, emulate: bool, fp8_all_gather: bool):
    """Swap eligible nn.Linear for torchao Float8Linear (or the MX Linear) in place. Returns (config, count)."""
    if is_mx(precision):
        if fp8_all_gather:
            raise ValueError(f"fp8_all_gather works only with fp8-tensorwise, not {precision}")
        return apply_mx(model, MX_RECIPES[precision], emulate=emulate)
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = float8_config(precision, emulate=emulate, fp8_all_gather=fp8_all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=fp8_module_filter)
    num_converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    num_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    log.info(
        "float8 %s: converted %d of %d Linear modules (emulate=%s, fp8_all_gather=%s)",
        precision,
        num_converted,
        num_linear,
        emulate,
        fp8_all_gather,
    )
    return config, num_converted


# ------------------------------------------------------------------------------------------------- MX


def mx_module_filter(module: nn.Module, fqn: str) -> bool:
    """As fp8_module_filter, with both dims divisible by the MX block (32): each is a GEMM reduction dim."""
    return (
        fp8_module_filter(module, fqn)
        and isinstance(module, nn.Linear)  # as fp8_module_filter checked; says so to the type checker
        and module.in_features % MX_BLOCK_SIZE == 0
        and module.out_features % MX_BLOCK_SIZE == 0
    )


_MX_LINEAR_CLASS = None


def mx_linear_class() -> type[Any]:
    """torchao's MXFP8Linear, with F.linear's autocast casts done by hand (as Float8Linear does).

    Under autocast our master weights stay fp32; torchao's MX autograd function runs below autocast and needs
    one dtype for activations and weights, so both are cast to the autocast dtype first, exactly what autocast
    does for a plain nn.Linear, and the function itself runs with autocast off."""
    global _MX_LINEAR_CLASS
    if _MX_LINEAR_CLASS is None:
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear, _to_mxfp8_then_scaled_mm

        class AutocastMXFP8Linear(MXFP8Linear):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                weight = self.weight
                device_type = x.device.type
                if torch.is_autocast_enabled(device_type):
                    dtype = torch.get_autocast_dtype(device_type)
                    x, weight = x.to(dtype), weight.to(dtype)
                with torch.autocast(device_type, enabled=False):
                    return _to_mxfp8_then_scaled_mm(
                        x,
                        weight,
                        kernel_preference=self.kernel_preference,
                        scale_calculation_mode=self.scale_calculation_mode,
                        wgrad_with_hp=self.wgrad_with_hp,
                    )

        _MX_LINEAR_CLASS = AutocastMXFP8Linear
    return _MX_LINEAR_CLASS


def apply_mx(model: nn.Module, recipe: MXRecipe, *, emulate: bool) -> tuple[MXRecipe, int]:
    """Swap eligible nn.Linear (no bias) for the MX Linear in place, sharing the weight Parameter.

    emulate (CPU): torchao's EMULATED kernel preference whatever the recipe. Returns (recipe, count)."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common import KernelPreference

    kernel = KernelPreference.EMULATED if emulate or recipe.kernel == "emulated" else KernelPreference.AUTO
    cls = mx_linear_class()
    targets = [(fqn, m) for fqn, m in model.named_modules() if mx_module_filter(m, fqn)]
    for fqn, old in targets:
        assert old.bias is None, f"{fqn}: the MX Linear here takes no bias"
        with torch.device("meta"):
            new = cls(
                old.in_features,
                old.out_features,
                bias=False,
                kernel_preference=kernel,
                scale_calculation_mode=ScaleCalculationMode(recipe.scale_mode),
                wgrad_with_hp=recipe.wgrad_with_hp,
            )
        new.weight = old.weight
        parent_name, _, child = fqn.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    num_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    log.info(
        "%s: converted %d of %d Linear modules to MXFP8 (kernel %s, %s scales)",
        recipe.precision,
        len(targets),
        num_linear,
        kernel.value,
        recipe.scale_mode,
    )
    return recipe, len(targets)


def fp8_dtypes_of_config(config) -> list[str]:
    """The 8-bit float dtypes a Float8LinearConfig casts to (disabled casts contribute nothing); an MX recipe's
    elements are e4m3 in every GEMM (its scales are e8m0)."""
    if isinstance(config, MXRecipe):
        return ["float8_e4m3fn"]
    from torchao.float8.config import ScalingType

    casts = (
        config.cast_config_input,
        config.cast_config_input_for_grad_weight,
        config.cast_config_weight,
        config.cast_config_weight_for_grad_input,
        config.cast_config_grad_output,
        config.cast_config_grad_output_for_grad_weight,
    )
    names = {
        str(c.target_dtype).removeprefix("torch.")
        for c in casts
        if c.scaling_type != ScalingType.DISABLED and c.target_dtype is not None
    }
    return sorted(names)


def precompute_fp8_scales(model: nn.Module) -> None:
    """After optimizer.step(): one fused amax over all fp8 weights for the next FSDP fp8 all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
