"""The techniques applied to the training step, and the recipe that applies them: how a Plan
turns a model into the thing one optimizer step runs (precision, checkpointing, LoRA, float8,
fused kernels and loss, MoE router loss, optimizers).

Shared by `trace` (on fake tensors, to predict) and `engine` (on real ones, to train), so a
prediction and a run can never disagree about which optimizer, precision or checkpointing
was used. Each technique is one short function; `prepare_model` applies them in order.
The names below are imported on first use: a module that needs one technique's constant
does not import the recipe (and with it transformers).
"""

from trainwise.common.lazy import lazy_attributes

_LAZY = {
    "build_optimizer": ("trainwise.techniques.optimizers", "build_optimizer"),
    "parameter_groups": ("trainwise.techniques.optimizers", "parameter_groups"),
    "PrecisionPolicy": ("trainwise.techniques.precision", "PrecisionPolicy"),
    "precision_policy": ("trainwise.techniques.precision", "precision_policy"),
    "prepare_model": ("trainwise.techniques.recipe", "prepare_model"),
    "compute_loss": ("trainwise.techniques.recipe", "compute_loss"),
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = list(_LAZY)
