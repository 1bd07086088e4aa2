"""Float8 training (`--float8`): the model's linear layers swapped for torchao's Float8Linear,
which casts each matmul's input, weight and output gradient to float8 with a dynamic
per-tensor scale and multiplies them on the float8 tensor cores (torch._scaled_mm).

What runs is torchao's; trainwise decides which layers take part and refuses what cannot
run. It changes the training math (float8 rounding of every converted matmul), so the
plan search tries it only when the user allows it."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.hardware.device import Device
from trainwise.hardware.installation import installed

INSTALL_LINE = "pip install 'trainwise[gpu]'"
# float8 GEMMs need both matrix dimensions to be multiples of 16 (cuBLASLt's fp8 layout).
FLOAT8_ALIGNMENT = 16
FLOAT8_PRECISIONS = ("bf16", "bf16-pure")


def check_float8(plan, device: Device, here: bool) -> None:
    """InputError naming --float8 when the plan's float8 cannot run on `device` (or, with
    `here`, on this machine). The plan-only rules come first, then the device, then
    compile (wherever it runs), then what must be installed here."""
    if not plan.float8:
        return
    problem = float8_plan_problem(plan)
    if problem is not None:
        raise problem
    _check_float8_device(device)
    # Eager float8 runs its scaling casts as separate kernels and is slower than bf16, so
    # --float8 without --compile would not give what the flag is for, on any target (an
    # estimate for a catalog GPU used to price it; the search never tries it).
    if not plan.compile:
        raise InputError("--float8", "is only faster than bf16 compiled (eager float8 runs its scaling casts as "
                                     "separate kernels): add --compile")
    if here:
        _check_float8_here(plan)
    elif not installed("torchao"):
        # The estimate traces torchao's own Float8Linear (its casts, scales and saved
        # tensors), so it needs the package too, though not a GPU.
        raise InputError("--float8", "is estimated by tracing torchao's float8 layers, and the torchao package is "
                                     f"not installed here ({INSTALL_LINE}, or pip install torchao: the trace needs "
                                     "no GPU)")


def float8_plan_problem(plan) -> InputError | None:
    """Why the rest of `plan` rules float8 out, wherever it runs (None: nothing does); the
    plan search asks this before it tries float8 on a plan."""
    if plan.precision not in FLOAT8_PRECISIONS:
        return InputError("--float8", f"casts bf16 matmuls to float8; --precision {plan.precision} is not bf16: "
                                      "use --precision bf16 or bf16-pure")
    if plan.lora:
        return InputError("--float8", "with LoRA (--lora-rank) is not supported yet: drop one of them")
    return None


def _check_float8_device(device: Device) -> None:
    if device.kind != "cuda":
        raise InputError("--float8", f"needs a CUDA GPU of compute capability 8.9+ (Ada, Hopper or newer) for "
                                     f"float8 matmuls; the target is {device.name}: drop --float8")
    gpu = device.gpu
    if gpu is not None and not gpu.supports_float8:
        capability = "{}.{}".format(*gpu.compute_capability)
        raise InputError("--float8", f"needs compute capability 8.9+ (Ada, Hopper or newer) for float8 matmuls; "
                                     f"{gpu.name} has {capability}: drop --float8")


def _check_float8_here(plan) -> None:
    """The rule for a run on this machine: torchao present."""
    if not installed("torchao"):
        raise InputError("--float8", f"needs the torchao package, which is not installed here ({INSTALL_LINE})")


def float8_layer_filter(model: nn.Module, local_widths=None):
    """The filter torchao calls with (module, qualified name): True for the nn.Linear layers
    to convert. Left out: the output head (its logits feed the loss, where float8 rounding
    costs most accuracy, and it is often tied to the input embedding), layers already
    converted, and any layer whose input or output width is not a multiple of 16.

    `local_widths(module, name)` gives the (input, output) widths one rank multiplies,
    or None for a layer that must stay as it is: under tensor parallel the engine converts
    before splitting, so it judges the split widths (what the per-rank estimate traces)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    widths = local_widths or (lambda module, name: (module.in_features, module.out_features))

    def convert(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear) or module is head or _is_float8(module):
            return False
        local = widths(module, name)
        return local is not None and all(width % FLOAT8_ALIGNMENT == 0 for width in local)

    return convert


def _is_float8(module: nn.Module) -> bool:
    return type(module).__name__ == "Float8Linear"


def apply_float8(model: nn.Module, plan, local_widths=None) -> nn.Module:
    """Swap the filtered linear layers for torchao Float8Linear (in place; returns `model`;
    layers already swapped stay as they are, so the engine may convert before tensor
    parallel and the recipe again after). Under FSDP2 the weights are all-gathered in
    float8 (half the bf16 traffic)."""
    chosen = float8_layer_filter(model, local_widths)
    names = {name for name, module in model.named_modules() if chosen(module, name)}
    if not names:
        if not any(_is_float8(module) for module in model.modules()):
            # Asked for float8, the step would run in bf16 without a word: refuse instead.
            raise InputError("--float8", f"converts no layer of this model: float8 training swaps nn.Linear layers "
                                         f"whose widths are multiples of {FLOAT8_ALIGNMENT} (not the output head), "
                                         "and it has none (GPT-2's projections are transformers' Conv1D); drop --float8")
        return model
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    sharded = plan.fsdp > 1 or (plan.zero or 0) >= 2
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=sharded)
    model = convert_to_float8_training(model, module_filter_fn=chosen, config=config)
    for name in names:
        model.get_submodule(name).register_forward_pre_hook(_input_in_autocast_dtype)
    return model


def gathered_in_float8(param: torch.Tensor) -> bool:
    """Whether FSDP2 all-gathers `param` in float8 (one byte per element, plus one fp32
    scale) rather than in its compute dtype: a converted layer's weight under the float8
    all-gather apply_float8 turns on for sharded plans. torchao then finds the weight's
    scale by an all-reduce of its shard's absolute maximum before each gather."""
    if not installed("torchao"):
        return False
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return isinstance(param, WeightWithDynamicFloat8CastTensor)


def _input_in_autocast_dtype(module: nn.Module, args: tuple):
    """Cast a converted layer's input to the autocast dtype, as torchao's forward does under
    CUDA autocast. torchao looks at CUDA autocast only; the estimate traces a CUDA step
    under CPU autocast (trainwise/trace/autocast_policy.py), where without this the input
    would stay fp32. On a GPU the cast is then a no-op (already that dtype)."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return (args[0].to(torch.get_autocast_dtype(device_type)), *args[1:])
    return None
