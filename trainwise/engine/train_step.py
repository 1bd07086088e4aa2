"""One optimizer step: grad_accum micro-batches forward and backward, then unscale, clip,
step, schedule and zero the gradients. The same sequence the tracer predicts
(trainwise/trace/step_trace.py), so the estimate measures what runs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from trainwise.engine.accumulation import gradient_sync, micro_batch_loss_scale
from trainwise.engine.parallel.reduce import clip_gradients, plain_loss
from trainwise.engine.parallel.reduce import mean_loss as parallel_mean_loss
from trainwise.engine.setup import TrainingSetup
from trainwise.plan.plan import Plan
from trainwise.techniques import compute_loss


@dataclass(frozen=True)
class StepOutcome:
    """What one step leaves on the device, not yet read (reading a tensor waits for the
    device: trainwise/engine/step_values.py reads a run of outcomes with one copy).

    loss: 0-dim tensor, mean unscaled loss over the micro-batches (over the job under a
    mesh); lr: the learning rate the step used; grad_norm: 0-dim tensor, total norm before
    clipping (None when not clipping); skipped: no parameter update was made (fp16
    overflow, or a non-finite loss under --on-nan skip), a 0-dim bool tensor or a plain
    bool where the step cannot skip; loss_scale: 0-dim tensor, the fp16 scale the step
    used (None without fp16)."""

    loss: torch.Tensor
    lr: float
    grad_norm: torch.Tensor | None
    skipped: torch.Tensor | bool
    loss_scale: torch.Tensor | None


def training_step(setup: TrainingSetup, batches: Iterator[dict], plan: Plan, *, skip_non_finite: bool) -> StepOutcome:
    """Run one optimizer step on the next `plan.grad_accum` micro-batches from `batches`,
    without waiting for the device (no value is read back here; see StepOutcome).

    A non-finite loss without loss scaling either skips the update (`skip_non_finite`) or
    is left for the caller to stop on when it reads the loss; under fp16 the scaler skips
    by itself."""
    local_loss = _forward_backward(setup, batches, plan)
    if setup.has_mesh:
        loss = parallel_mean_loss(local_loss, setup.distributed)  # the same value on every rank
    else:
        loss = local_loss
    lr = setup.optimizer.param_groups[0]["lr"]
    if skip_non_finite and not setup.scaler.is_enabled() and not _can_skip_on_device(setup):
        if not bool(torch.isfinite(loss)):  # this optimizer cannot skip by itself: one read per step
            setup.optimizer.zero_grad(set_to_none=True)
            setup.scheduler.step()
            return StepOutcome(loss, lr, None, True, None)
        skip_non_finite = False
    grad_norm = _clip(setup, plan)
    skipped = _optimizer_step(setup, loss if skip_non_finite else None)
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)
    return StepOutcome(loss, lr, grad_norm, *skipped)


def _forward_backward(setup: TrainingSetup, batches: Iterator[dict], plan: Plan) -> torch.Tensor | None:
    """Forward and backward of the step's micro-batches; their mean loss on the device
    (None on a pipeline rank without the last stage)."""
    scale = micro_batch_loss_scale(plan.grad_accum)
    losses = []
    for index in range(plan.grad_accum):
        host_batch = next(batches)
        last = index == plan.grad_accum - 1
        if setup.pipeline is not None:
            setup.pipeline.check_batch(host_batch)  # on the host copy: no device read
            batch = to_device(host_batch, setup.device, non_blocking=plan.pin_memory)
            # The schedule runs forward and backward of its pipeline micro-batches; the
            # loss (last stage only) comes back already scaled for accumulation.
            with setup.loss_context(), gradient_sync(setup.model, enabled=last), autocast(setup):
                loss = setup.pipeline.step(batch)
            if loss is not None:
                losses.append(plain_loss(loss).detach().float())
            del loss, batch, host_batch
            continue
        batch = to_device(host_batch, setup.device, non_blocking=plan.pin_memory)
        with setup.loss_context():  # vocab-parallel cross-entropy under tensor parallel
            with gradient_sync(setup.forward, enabled=last), autocast(setup):
                loss = compute_loss(setup.forward, batch)
            setup.scaler.scale(loss * scale).backward()
        losses.append(plain_loss(loss).detach().float())
        del loss, batch, host_batch
    if setup.pipeline is not None:
        setup.pipeline.finish_gradients()  # a head tied to the embedding: add the two stages' gradients
    return torch.stack(losses).mean() if losses else None


def _clip(setup: TrainingSetup, plan: Plan) -> torch.Tensor | None:
    """Clip the gradients to plan.max_grad_norm; their total norm before clipping, on the
    device (None when not clipping). clip_grad_norm_ scales by a device tensor: no read."""
    if plan.max_grad_norm <= 0:
        return None
    setup.scaler.unscale_(setup.optimizer)  # clip the true gradients, not the scaled ones
    params = [p for p in setup.model.parameters() if p.grad is not None]
    if setup.has_mesh:
        pipeline = setup.pipeline
        counted_elsewhere = pipeline.counted_elsewhere() if pipeline is not None else ()
        return clip_gradients(params, plan.max_grad_norm, setup.distributed, counted_elsewhere)
    return torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, foreach=True)


def _optimizer_step(setup: TrainingSetup, skip_if_non_finite: torch.Tensor | None):
    """Step the optimizer; (skipped, fp16 scale used) as device tensors. Under fp16 the
    scaler decides (it reads its overflow flag unless the optimizer is fused); a loss given
    in `skip_if_non_finite` makes a fused optimizer skip on the device when it is not finite."""
    optimizer, scaler = setup.optimizer, setup.scaler
    if scaler.is_enabled():
        scale_before = scaler._get_scale_async().clone()  # get_scale() would read it; updated in place
        scaler.step(optimizer)
        scaler.update()
        return scaler._get_scale_async() < scale_before, scale_before
    if skip_if_non_finite is None:
        optimizer.step()
        return False, None
    not_finite = ~torch.isfinite(skip_if_non_finite)
    # The found-inf protocol GradScaler uses for fused optimizers: the step (and its step
    # count) is undone on the device where the flag is set.
    optimizer.grad_scale, optimizer.found_inf = None, not_finite.float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf
    return not_finite, None


def _can_skip_on_device(setup: TrainingSetup) -> bool:
    """Whether the optimizer takes GradScaler's found-inf flag (fused AdamW), so a step
    can be skipped without reading the loss. Not tried on sharded (DTensor) parameters."""
    return bool(getattr(setup.optimizer, "_step_supports_amp_scaling", False)) and not setup.has_mesh


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
