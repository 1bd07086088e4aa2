"""One real CPU training step as `trainwise train` runs it under --compile (or eager), its
peak measured as the CPU probe step counts it: what is alive at the step's start plus the
highest running sum of the profiler's allocation events during it. The second step is the
measured one (the first compiles). Shared by tests/test_compile_memory.py and
benchmarks/compiled_saved_cpu.py, which also looks at what the step saves for backward."""

from __future__ import annotations

import gc
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from trainwise.engine.compile_regions import compile_model_parts
from trainwise.engine.memory_probe import highest_running_sum, unique_storage_bytes
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model


def second_step_peak(name: str, plan: Plan, after_forward: Callable | None = None) -> tuple[int, object]:
    """(peak bytes of the second step of model `name` under `plan`, what
    `after_forward(loss, weights)` returned on that step, or None). `weights` are the data
    pointers of the model's parameters and buffers."""
    spec = resolve_model(name)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = build_model(spec, "cpu", attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
    model = prepare_model(model, plan, precision_policy(plan.precision, "cpu"), spec.task)
    forward = compile_model_parts([model], plan, in_place=False)[0]
    optimizer = build_optimizer(plan, model, "cpu")
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = None
    for _ in range(2):
        gc.collect()
        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        baseline = unique_storage_bytes([*model.parameters(), *model.buffers(), *state])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            batch = example_batch(spec, plan.batch_size, plan.seq_len, device="cpu", generator=generator)
            loss = compute_loss(forward, batch)
            seen = after_forward(loss, weights) if after_forward is not None else None
            loss.backward()
            del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del batch
    return baseline + highest_running_sum(prof.profiler.kineto_results.events()), seen
