"""Fused kernels (`--kernels liger`): Liger-Kernel's Triton kernels patched into the built
model at run time, for the families Liger supports. The user's model code is not edited:
Liger rebinds the forward of the existing norm and MLP modules, replaces the rotary
function of the family's transformers module, and (for a causal LM) the model's forward
with one that computes the head and the cross-entropy in chunks without full logits.

Triton kernels run on CUDA only, and cannot run on fake tensors: a model built on the meta
device (for the estimate's fake-tensor trace) gets a stand-in that keeps for backward what
Liger's kernels keep (trainwise/techniques/liger_stand_in.py)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from trainwise.common.errors import InputError
from trainwise.hardware.device import Device
from trainwise.hardware.installation import installed

INSTALL_LINE = "pip install 'trainwise[gpu]'"


@dataclass(frozen=True)
class LigerPatch:
    """What Liger patches in one family: its liger_kernel.transformers function and the
    name of its gated-MLP switch (SwiGLU for most, GeGLU for Gemma)."""

    function: str
    mlp_switch: str


# Config model_type -> the patch. Only families whose patch takes an already-built model
# (`model=`) and whose modules trainwise's catalog or a Hugging Face folder can produce.
LIGER_FAMILIES: dict[str, LigerPatch] = {
    "llama": LigerPatch("apply_liger_kernel_to_llama", "swiglu"),
    "mistral": LigerPatch("apply_liger_kernel_to_mistral", "swiglu"),
    "qwen2": LigerPatch("apply_liger_kernel_to_qwen2", "swiglu"),
    "qwen3": LigerPatch("apply_liger_kernel_to_qwen3", "swiglu"),
    "gemma": LigerPatch("apply_liger_kernel_to_gemma", "geglu"),
    "gemma2": LigerPatch("apply_liger_kernel_to_gemma2", "geglu"),
    "gemma3_text": LigerPatch("apply_liger_kernel_to_gemma3_text", "geglu"),
}


def check_kernels(plan, device: Device, spec=None, here: bool = False) -> None:
    """InputError naming --kernels when Liger cannot run: not a CUDA target, a family Liger
    does not patch (read from `spec`, a ModelSpec; not checked without one), or, with
    `here`, liger-kernel missing on this machine."""
    if plan.kernels == "none":
        return
    if device.kind != "cuda":
        raise InputError("--kernels", f"liger needs a CUDA GPU (its kernels are Triton kernels); the target is "
                                      f"{device.name}: use --kernels none")
    if plan.tp > 1 or plan.pp > 1:
        raise InputError("--kernels", "liger with tensor or pipeline parallel (--tp, --pp) is not supported yet: "
                                      "use --kernels none")
    if plan.grad_ckpt and plan.grad_ckpt_policy == "selective":
        # Liger's rotary kernel rotates q and k in their own storage; selective checkpointing
        # keeps those projection outputs, so its recomputation rotates them a second time
        # (gradients off by 1e-3 on a tiny Llama with the traced stand-in; 3e-8 under full).
        raise InputError("--kernels", "liger rotates q and k in place, which the outputs selective checkpointing "
                                      "keeps do not survive (its recomputation would rotate them twice): use "
                                      "--grad-ckpt-policy full, or --kernels none")
    if spec is not None and spec.family not in LIGER_FAMILIES:
        raise InputError("--kernels", f"liger needs a model of the families it patches ({', '.join(LIGER_FAMILIES)}); "
                                      f"this model is {spec.family or 'a model function'}: use --kernels none")
    if here and not installed("liger_kernel"):
        raise InputError("--kernels", f"liger needs the liger-kernel package, which is not installed here "
                                      f"({INSTALL_LINE})")


def liger_arguments(family: str, task: str | None, loss: str = "default") -> dict:
    """Keyword arguments for the family's Liger patch: every kernel it has, with Liger's
    fused linear cross-entropy when the plan asks for the fused loss (`--loss fused`) of a
    causal LM (other heads keep their own loss; without the flag the loss stays the model's)."""
    patch = LIGER_FAMILIES[family]
    return {"rope": True, "rms_norm": True, patch.mlp_switch: True, "cross_entropy": False,
            "fused_linear_cross_entropy": task == "causal-lm" and loss == "fused"}


def apply_kernels(model: nn.Module, plan, task: str | None) -> nn.Module:
    """Patch Liger's kernels into `model` (in place; returns it). Call on the built model
    before LoRA wraps it, so the patch finds the family's own modules. A model on the meta
    device is one being traced: it gets the stand-in (its memory is Liger's, its ops plain
    PyTorch that fake tensors can run)."""
    if plan.kernels == "none":
        return model
    family = model.config.model_type
    arguments = liger_arguments(family, task, plan.loss)
    if any(p.is_meta for p in model.parameters()):
        from trainwise.techniques.liger_stand_in import patch_liger_stand_in

        return patch_liger_stand_in(model, family, arguments, task)
    import liger_kernel.transformers as liger

    patch = getattr(liger, LIGER_FAMILIES[family].function)
    patch(model=model, **arguments)
    return model
