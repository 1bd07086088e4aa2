"""Trace one steady-state training step on fake tensors: the StepTrace every estimate reads
(its data: trainwise/trace/step_trace_data.py)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy
from trainwise.techniques.activation_offload import OFFLOADER_ATTRIBUTE
from trainwise.techniques.precision import PrecisionPolicy
from trainwise.techniques.selective_checkpoint import observe_kept
from trainwise.trace.autocast_policy import autocast_for_target, cuda_autocast_kernels
from trainwise.trace.blocks import BlockTracker
from trainwise.trace.ctc_loss import traceable_ctc_loss
from trainwise.trace.cuda_kernels import cuda_kernel_choices
from trainwise.trace.fake_model import materialize_fake
from trainwise.trace.layer_norm_stats import layer_norm_fixes
from trainwise.trace.module_scope import ModuleScope
from trainwise.trace.moe_kernels import traceable_experts
from trainwise.trace.fusion import CompiledRegions
from trainwise.trace.op_costs import OpCostRecorder
from trainwise.trace.recorder import AllocationRecorder
from trainwise.trace.step_trace_data import StepTrace
from trainwise.trace.storage import OFFLOADED_OP
from trainwise.trace.untraced_transformers import documents_in_every_row, fake_tensors_are_not_tracing


def trace_training_step(model: nn.Module, batch_fn, plan: Plan, target_device_type: str,
                        task: str | None = None, *, compiled_pricing: bool = False) -> StepTrace:
    """Run one optimizer step of `plan` on a meta-device `model` under FakeTensorMode.

    `batch_fn()` builds one micro-batch (called inside the fake mode, so its tensors are
    fake). `target_device_type` ('cpu' or 'cuda') selects the autocast policy and optimizer
    kernels the real step would use; the trace itself always runs on fake CPU tensors.
    `compiled_pricing`: price the ops as compiled too when the plan does not compile
    (`op_costs_by_compile`, see step_trace_data.py's `priced_as`)."""
    from trainwise.techniques.recipe import prepare_model

    policy = precision_policy(plan.precision, target_device_type)
    model = prepare_model(model, plan, policy, task)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    scope = ModuleScope(model)
    blocks = BlockTracker(model)
    recorder = AllocationRecorder(scope, blocks)
    regions = CompiledRegions(plan.compile_scope, blocks) if plan.compile or compiled_pricing else None
    recorder.costs = OpCostRecorder(model, regions, recorder.key_of)
    low_precision = policy.param_dtype != torch.float32 or policy.autocast_dtype is not None
    recorder.output_fixes.update(layer_norm_fixes(target_device_type, low_precision))
    offloaded_activations(model, recorder, target_device_type)
    with traceable_experts(), traceable_ctc_loss(), fake_tensors_are_not_tracing(), cuda_kernel_choices(target_device_type), \
            documents_in_every_row(plan.packing == "documents"), \
            FakeTensorMode(allow_non_fake_inputs=False), scope, blocks, recorder:
        materialize_fake(model, "cpu")
        for tensor in [*model.parameters(), *model.buffers()]:
            recorder.track(tensor, op="weights")
        recorder.set_owners((tensor, block) for block, module in enumerate(blocks.modules)
                            for tensor in [*module.parameters(), *module.buffers()])
        optimizer = traced_optimizer(plan, model, target_device_type)
        create_optimizer_state(model, optimizer)
        # State a parameter's optimizer made without reading it (step counters) is its too.
        block_of = {id(p): block for block, module in enumerate(blocks.modules) for p in module.parameters()}
        recorder.set_owners((t, block_of[id(p)]) for p, state in optimizer.state.items() if id(p) in block_of
                            for t in state.values() if isinstance(t, torch.Tensor))
        micro_steps = min(plan.grad_accum, 2)  # later micro-steps repeat the second exactly
        window_start = len(recorder.events)
        phase_starts = _run_step(model, optimizer, batch_fn, plan, policy, recorder, micro_steps,
                                 target_device_type)
        _categorise(model, optimizer, recorder)
    pricings = {False: recorder.costs.costs}
    if regions is not None:
        pricings[True] = recorder.costs.compiled_costs
    return StepTrace(recorder.events, recorder.records, window_start, phase_starts, params, trainable,
                     micro_steps, target_device_type, recorder.event_blocks, blocks.blocks, pricings[plan.compile],
                     pricings)


def offloaded_activations(model: nn.Module, recorder: AllocationRecorder, target_device_type: str) -> None:
    """Under --activation-offload the blocks' saved tensors pass through the offloader's
    hooks, not the recorder's: the kept ones are marked saved here, and for a CUDA target
    the fake host tensors stand for device ones, so their copies are made as the engine
    makes them and marked host memory (trainwise/estimator/memory.py leaves them out of
    the device's figures and counts them as host memory)."""
    offloader = getattr(model, OFFLOADER_ATTRIBUTE, None)
    if offloader is None:
        return
    offloader.on_kept = recorder._on_save
    if target_device_type != "cpu":
        offloader.simulate_device_type = target_device_type
        offloader.on_host_copy = lambda host: mark_offloaded(recorder, host)


def mark_offloaded(recorder: AllocationRecorder, host: torch.Tensor) -> None:
    record = recorder.records[recorder.track(host)]
    record.host_resident, record.op = True, OFFLOADED_OP


def traced_optimizer(plan: Plan, model: nn.Module, target_device_type: str) -> torch.optim.Optimizer:
    if plan.optim == "adamw-8bit":
        from trainwise.techniques.optimizers import parameter_groups
        from trainwise.trace.bnb_state import AdamW8bitStateModel

        return AdamW8bitStateModel(parameter_groups(model, plan.weight_decay), lr=plan.lr)
    return build_optimizer(plan, model, target_device_type)


def create_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Optimizers create their state lazily on the first step; make it exist before the
    measured step, using stand-in gradients (only shapes matter on fake tensors)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _run_step(model, optimizer, batch_fn, plan: Plan, policy: PrecisionPolicy, recorder,
              micro_steps: int, target_device_type: str):
    phase_starts = []

    def enter(phase):
        recorder.phase = phase
        if recorder.blocks is not None:
            recorder.blocks.reset()
        phase_starts.append((phase, len(recorder.events)))

    loss_scale = 2.0**16 if policy.loss_scaling else None
    # Checkpointing recomputes the forward inside backward, re-entering autocast there, so
    # CUDA's cast policy must stay installed through backward too.
    cuda_policy = target_device_type == "cuda" and policy.autocast_dtype is not None
    with cuda_autocast_kernels() if cuda_policy else contextlib.nullcontext():
        for micro_step in range(micro_steps):
            recorder.costs.micro_step = micro_step
            enter("data")
            batch = batch_fn()
            enter("forward")
            with autocast_for_target(policy, target_device_type), observe_kept(recorder.mark_saved):
                loss = compute_loss(model, batch) / plan.grad_accum
            enter("backward")
            (loss * loss_scale if loss_scale else loss).backward()
            del loss, batch
    enter("optimizer")
    trainable = [p for p in model.parameters() if p.grad is not None]
    recorder.grad_keys = {recorder.key_of(p.grad) for p in trainable}
    if loss_scale:  # GradScaler.unscale_: an in-place multi-tensor kernel plus a flag
        found_inf = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_([p.grad for p in trainable], found_inf,
                                                         torch.full((1,), 1.0 / loss_scale))
    if plan.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(trainable, plan.max_grad_norm, foreach=True)
    optimizer.step()
    enter("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    return phase_starts


def _categorise(model: nn.Module, optimizer: torch.optim.Optimizer, recorder: AllocationRecorder) -> None:
    weights = {recorder.key_of(t) for t in model.parameters()}
    buffers = {recorder.key_of(t) for t in model.buffers()} - weights
    state = {recorder.key_of(t) for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)}
    for key in _host_step_counters(optimizer, recorder):
        recorder.records[key].host_resident = True
    for record in recorder.records:
        if record.key in weights:
            record.category = "weights"
        elif record.key in buffers:
            record.category = "buffers"
        elif record.key in state:
            record.category = "optimizer"
        elif record.key in recorder.grad_keys:
            record.category = "gradients"
        elif "forward" in record.saved_in:
            record.category = "activations"


def _host_step_counters(optimizer: torch.optim.Optimizer, recorder: AllocationRecorder) -> set[int]:
    """Keys of per-parameter step counters that live in host memory whatever the device.

    torch.optim's AdamW keeps `state["step"]` on the CPU unless it is fused or capturable
    (kernel launches for a scalar cost more than a host add), and Adafactor always does;
    on a GPU they are no device memory. On the CPU they are, so they stay in the trace
    and only the device's accounting (trainwise/estimator/memory.py) leaves them out."""
    keys = set()
    for group in optimizer.param_groups:
        if device_step_counter(group, "cuda"):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                keys.add(recorder.key_of(step))
    keys.discard(None)
    return keys


def device_step_counter(group: dict, device_type: str) -> bool:
    """Whether this optimizer group's step counters are device memory on `device_type`
    (see _host_step_counters)."""
    return device_type != "cuda" or bool(group.get("fused") or group.get("capturable"))
