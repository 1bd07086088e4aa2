"""The step recipe: the techniques every layout applies to the model itself, in order, and
how a loss is read from its output. The engine runs it after tensor parallel and before
the pipeline split (engine/parallelize.py); the estimate traces the same recipe."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.models.documents import attend_within_documents
from trainwise.plan.plan import Plan
from trainwise.techniques.activation_offload import enable_activation_offload
from trainwise.techniques.block_stacks import stacked_blocks
from trainwise.techniques.checkpointing import enable_checkpointing
from trainwise.techniques.float8 import apply_float8
from trainwise.techniques.kernels import apply_kernels
from trainwise.techniques.fused_loss_model import apply_fused_loss
from trainwise.techniques.lora import apply_lora
from trainwise.techniques.moe import enable_router_aux_loss
from trainwise.techniques.precision import PrecisionPolicy


def prepare_model(model: nn.Module, plan: Plan, policy: PrecisionPolicy, task: str | None = None) -> nn.Module:
    """Apply, in order: MoE router loss -> KV cache off (--packing documents) -> fused
    kernels -> LoRA adapters -> fused loss -> float8 linear layers -> gradient
    checkpointing -> activation offload -> weight dtype -> train mode.

    Kernels first so Liger finds the family's own modules; LoRA before checkpointing so
    checkpointing wraps the adapted blocks; float8 before checkpointing and the dtype cast
    so the swapped layers are wrapped and cast like the others; offload after checkpointing
    so its hooks sit outside the checkpoint (what moves is then the block input the
    checkpoint keeps); the dtype cast last so adapters are cast too under bf16-pure."""
    enable_router_aux_loss(model)
    if plan.packing == "documents" or plan.grad_ckpt:
        # documents: else a KV cache hides the documents from the mask. Checkpointing:
        # transformers turns the cache off itself then, with a warning at every run.
        attend_within_documents(model)
    model = apply_kernels(model, plan, task)
    if plan.lora:
        model = apply_lora(model, plan, task)
    if plan.loss == "fused" and plan.kernels != "liger":  # under Liger its own fused loss is patched in
        model = apply_fused_loss(model, task)
    if plan.float8:
        model = apply_float8(model, plan)
    if plan.grad_ckpt:
        model = enable_checkpointing(model, plan.grad_ckpt_policy, plan.grad_ckpt_every)
    if plan.activation_offload:
        enable_activation_offload(model, stacked_blocks(model))
    if policy.param_dtype != torch.float32:
        model = model.to(policy.param_dtype)
    model.train()
    return model


def compute_loss(model: nn.Module, batch) -> torch.Tensor:
    """Run the model on one micro-batch and return its scalar loss. Images, audio and
    features arrive in fp32; with low-precision weights (bf16-pure, fp16-pure) they are
    cast to the weights' dtype first, as a convolution refuses mixed dtypes."""
    if isinstance(batch, dict):
        batch = _floats_in_weight_dtype(model, batch)
    output = model(**batch) if isinstance(batch, dict) else model(batch)
    loss = output if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)):
        loss = output[0]
    if loss is None:
        raise ValueError(f"{type(model).__name__} returned no loss; give it labels or return a loss tensor")
    return loss


def _floats_in_weight_dtype(model: nn.Module, batch: dict) -> dict:
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is None or weight.dtype == torch.float32:
        return batch
    return {key: value.to(weight.dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            for key, value in batch.items()}
