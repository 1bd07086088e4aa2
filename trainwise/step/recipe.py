"""The step recipe: the techniques every layout applies to the model itself, in order, and
how a loss is read from its output. The engine runs it after tensor parallel and before
the pipeline split (engine/parallelize.py); the estimate traces the same recipe."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.plan.plan import Plan
from trainwise.step.checkpointing import enable_checkpointing
from trainwise.step.lora import apply_lora
from trainwise.step.moe import enable_router_aux_loss
from trainwise.step.precision import PrecisionPolicy


def prepare_model(model: nn.Module, plan: Plan, policy: PrecisionPolicy, task: str | None = None) -> nn.Module:
    """Apply, in order: MoE router loss -> LoRA adapters -> gradient checkpointing ->
    weight dtype -> train mode.

    LoRA first so checkpointing wraps the adapted blocks; the dtype cast last so adapters
    are cast too under bf16-pure."""
    enable_router_aux_loss(model)
    if plan.lora:
        model = apply_lora(model, plan, task)
    if plan.grad_ckpt:
        model = enable_checkpointing(model, plan.grad_ckpt_policy, plan.grad_ckpt_every)
    if policy.param_dtype != torch.float32:
        model = model.to(policy.param_dtype)
    model.train()
    return model


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    """Run the model on one micro-batch and return its scalar loss."""
    output = model(**batch) if isinstance(batch, dict) else model(batch)
    loss = output if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)):
        loss = output[0]
    if loss is None:
        raise ValueError(f"{type(model).__name__} returned no loss; give it labels or return a loss tensor")
    return loss
