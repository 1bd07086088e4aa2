"""The training-step recipe: how a Plan turns a model into the thing one step runs.

Shared by `trace` (on fake tensors, to predict) and `engine` (on real ones, to train), so a
prediction and a run can never disagree about which optimizer, precision or checkpointing
was used. Each technique is one short function; `prepare_model` applies them in order.
"""

from trainwise.step.optimizers import build_optimizer, parameter_groups
from trainwise.step.precision import PrecisionPolicy, precision_policy
from trainwise.step.recipe import prepare_model, compute_loss

__all__ = [
    "build_optimizer",
    "parameter_groups",
    "PrecisionPolicy",
    "precision_policy",
    "prepare_model",
    "compute_loss",
]
