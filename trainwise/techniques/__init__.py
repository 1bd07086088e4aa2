"""The techniques applied to the training step, and the recipe that applies them: how a Plan
turns a model into the thing one optimizer step runs (precision, checkpointing, LoRA, float8,
fused kernels and loss, MoE router loss, optimizers).

Shared by `trace` (on fake tensors, to predict) and `engine` (on real ones, to train), so a
prediction and a run can never disagree about which optimizer, precision or checkpointing
was used. Each technique is one short function; `prepare_model` applies them in order.
"""

from trainwise.techniques.optimizers import build_optimizer, parameter_groups
from trainwise.techniques.precision import PrecisionPolicy, precision_policy
from trainwise.techniques.recipe import prepare_model, compute_loss

__all__ = [
    "build_optimizer",
    "parameter_groups",
    "PrecisionPolicy",
    "precision_policy",
    "prepare_model",
    "compute_loss",
]
