"""One optimizer step: grad_accum micro-batches forward and backward, then unscale, clip,
step, schedule and zero the gradients. The same sequence the tracer predicts
(trainwise/trace/step_trace.py), so the estimate measures what runs."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch

from trainwise.engine.accumulation import gradient_sync, micro_batch_loss_scale
from trainwise.engine.parallel.reduce import clip_gradients, plain_loss
from trainwise.engine.parallel.reduce import mean_loss as parallel_mean_loss
from trainwise.engine.setup import TrainingSetup
from trainwise.plan.plan import Plan
from trainwise.step import compute_loss


@dataclass(frozen=True)
class StepOutcome:
    """loss: mean unscaled loss over the micro-batches; grad_norm: total norm before
    clipping (None when not clipping or skipped); skipped: no parameter update was made
    (fp16 overflow, or a non-finite loss under --on-nan skip); loss_scale: fp16 scale."""

    loss: float
    lr: float
    grad_norm: float | None
    skipped: bool
    loss_scale: float | None


def training_step(setup: TrainingSetup, batches: Iterator[dict], plan: Plan, *, skip_non_finite: bool) -> StepOutcome:
    """Run one optimizer step on the next `plan.grad_accum` micro-batches from `batches`.

    A non-finite loss without loss scaling either skips the update (`skip_non_finite`) or
    is returned as is, for the caller to stop on; under fp16 the scaler skips by itself."""
    model, optimizer, scaler = setup.model, setup.optimizer, setup.scaler
    scale = micro_batch_loss_scale(plan.grad_accum)
    losses = []
    for index in range(plan.grad_accum):
        batch = to_device(next(batches), setup.device, non_blocking=plan.pin_memory)
        last = index == plan.grad_accum - 1
        if setup.pipeline is not None:
            # The schedule runs forward and backward of its pipeline micro-batches; the
            # loss (last stage only) comes back already scaled for accumulation.
            with setup.loss_context(), gradient_sync(setup.model, enabled=last), autocast(setup):
                loss = setup.pipeline.step(batch)
            if loss is not None:
                losses.append(plain_loss(loss).detach().float())
            del loss, batch
            continue
        with setup.loss_context():  # vocab-parallel cross-entropy under tensor parallel
            with gradient_sync(setup.forward, enabled=last), autocast(setup):
                loss = compute_loss(setup.forward, batch)
            scaler.scale(loss * scale).backward()
        losses.append(plain_loss(loss).detach().float())
        del loss, batch
    if setup.pipeline is not None:
        setup.pipeline.finish_gradients()  # a head tied to the embedding: add the two stages' gradients
    local_loss = torch.stack(losses).mean() if losses else None
    if setup.has_mesh:
        mean_loss = parallel_mean_loss(local_loss, setup.distributed)  # the same value on every rank
    else:
        mean_loss = local_loss.item()  # one device sync per step
    lr = optimizer.param_groups[0]["lr"]
    if not math.isfinite(mean_loss) and not scaler.is_enabled():
        optimizer.zero_grad(set_to_none=True)
        if skip_non_finite:
            setup.scheduler.step()
        return StepOutcome(mean_loss, lr, None, True, None)
    grad_norm = None
    if plan.max_grad_norm > 0:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        params = [p for p in model.parameters() if p.grad is not None]
        if setup.has_mesh:
            counted_elsewhere = setup.pipeline.counted_elsewhere() if setup.pipeline is not None else ()
            grad_norm = clip_gradients(params, plan.max_grad_norm, setup.distributed, counted_elsewhere)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, foreach=True).item()
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    setup.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if skipped or (grad_norm is not None and not math.isfinite(grad_norm)):
        grad_norm = None
    return StepOutcome(mean_loss, lr, grad_norm, bool(skipped), scale_before)


def autocast(setup: TrainingSetup):
    """Mixed-precision autocast for the forward pass, or nothing for fp32/tf32/bf16-pure."""
    dtype = setup.policy.autocast_dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(setup.device.type, dtype=dtype)


def to_device(batch, device: torch.device, non_blocking: bool = False):
    """Move a micro-batch (a dict of tensors, or a tensor) to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    return {key: value.to(device, non_blocking=non_blocking) if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}
