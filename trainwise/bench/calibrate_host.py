"""A real training step's host time per op and arithmetic factor, for the CPU's time model.

A tiny eager `torch.add` in a loop costs the dispatcher about 1.5 us on a small CPU; an op
of a training step costs the host far more: autograd records a graph node for it in
forward and runs that node in backward, the model's Python (module calls, masks, rotary
tables) runs around it, the loop makes the batch, reads the loss and clips. And a training
step's kernels run slower than the same kernels timed alone in a loop, with their operands
hot in cache. Both are measured where they happen: the catalog's tiny-llama is trained as
trainwise's step does it (a fresh batch, forward with the loss, backward, the loss read,
gradient clipping, AdamW foreach, the LR schedule, zero_grad) at two sizes, one whose
arithmetic is a few percent of the step and one whose arithmetic is most of it; with the
arithmetic the time model prices at the rates measured in isolation, and the ops the
traced step dispatches (views at a quarter), the two steps give the two unknowns:
`step = factor x arithmetic + host x ops`.

On one thread the step's time is this process's CPU time (`time.process_time`), which a
busy machine does not stretch; with more threads it is wall time (CPU time would add the
threads up)."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainwise.bench.calibrate_timing import Settings, clock_of, synchronizer
from trainwise.hardware.profile import DeviceProfile, Rate

REFERENCE_MODEL = "tiny-llama"
# (batch, tokens) of the two reference steps: one whose arithmetic is a few percent of the
# step (sets the host time per op), one whose arithmetic is most of it (sets the factor).
HOST_BOUND, COMPUTE_BOUND = (1, 8), (4, 128)


def measure_training_host(device: torch.device, measured: DeviceProfile, settings: Settings) -> tuple[float, float, dict]:
    """(host seconds per op of a training step, the factor by which a training step's
    arithmetic runs slower than the rates measured in isolation, what was measured), on
    the CPU. `measured` holds the rates already measured (its host_s_per_op is not used).
    Two reference steps, two unknowns: step = factor x arithmetic + host x ops."""
    from trainwise.hardware.resolve import resolve_device
    from trainwise.plan.plan import Plan

    points = []
    for batch_size, seq_len in (HOST_BOUND, COMPUTE_BOUND):
        plan = Plan(batch_size=batch_size, seq_len=seq_len, device="cpu")
        compute_s, ops = predicted_compute_and_ops(plan, resolve_device("cpu"), measured)
        step_s, spread = time_training_steps(device, plan, steps=20 if settings.quick else 60)
        points.append({"batch_size": batch_size, "seq_len": seq_len, "step_s": step_s, "arithmetic_s": compute_s,
                       "ops": ops, "spread": spread})
    host, factor = host_and_factor(*points)
    return host, factor, {"what": f"{REFERENCE_MODEL} trained (forward, backward, loss read, clipping, AdamW, zero_grad)"
                                  " at two sizes; step = factor x predicted arithmetic + host x ops (views a quarter)",
                          "steps": points}


def host_and_factor(small: dict, large: dict) -> tuple[float, float]:
    """(host seconds per op, arithmetic factor) through two reference steps, each
    {"step_s", "arithmetic_s", "ops"}: the factor is the slope of step time over the
    predicted arithmetic, held at >= 1 (a step's kernels do not beat the same kernels
    timed hot in a loop; a smaller slope is noise), and the host time what the smaller
    step has left per op."""
    rise = large["arithmetic_s"] - small["arithmetic_s"]
    factor = (large["step_s"] - small["step_s"]) / rise if rise > 0 else 1.0
    factor = max(factor, 1.0)
    host = (small["step_s"] - factor * small["arithmetic_s"]) / small["ops"]
    if host <= 0:
        # A slope so steep that it leaves the small step no host time is noise (the larger
        # step was slowed by something else): read the host time from the small step at
        # factor 1, and the factor from the larger step given that host time.
        host = max(small["step_s"] - small["arithmetic_s"], 0.0) / small["ops"]
        factor = max((large["step_s"] - host * large["ops"]) / large["arithmetic_s"], 1.0)
    return host, factor


def predicted_compute_and_ops(plan, device, measured: DeviceProfile) -> tuple[float, float]:
    """(seconds of the step's arithmetic at the measured rates, weighted op count): the time
    model priced once without host time and once with a host time of 1 s per op."""
    from trainwise.estimate.predict import one_device_estimate
    from trainwise.models import resolve_model

    spec = resolve_model(REFERENCE_MODEL)
    without_host = one_device_estimate(spec, plan, device, profile=dataclasses.replace(measured, host_s_per_op=0.0,
                                                                                    step_compute_factor=1.0))
    free = Rate(per_s=float("inf"))
    counting = dataclasses.replace(measured, host_s_per_op=1.0, memory=free, attention={},
                                   matmul={name: free for name in measured.matmul}, corrections={})
    ops = one_device_estimate(spec, plan, device, profile=counting).time.breakdown["host_overhead"]
    return without_host.time.step_s, ops


def time_training_steps(device: torch.device, plan, steps: int) -> tuple[float, float]:
    """(median seconds of one training step, (max - min) / median over blocks of steps)."""
    from trainwise.engine.schedule import build_scheduler
    from trainwise.models import build_model, example_batch, resolve_model
    from trainwise.step.optimizers import build_optimizer
    from trainwise.step.recipe import compute_loss

    spec = resolve_model(REFERENCE_MODEL)
    torch.manual_seed(0)
    model = build_model(spec, device=device, batch_size=plan.batch_size, seq_len=plan.seq_len)
    model.train()
    optimizer = build_optimizer(plan, model, device.type)
    scheduler = build_scheduler(optimizer, 10**6, 0, plan.lr_schedule)
    clock = clock_of(synchronizer(device))

    def one_step():
        batch = {k: v.to(device) for k, v in example_batch(spec, plan.batch_size, plan.seq_len).items()}
        loss = compute_loss(model, batch)
        loss.backward()
        loss.item()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), plan.max_grad_norm, foreach=True).item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):
        one_step()  # warm-up: the optimizer's state, the allocator's caches
    blocks = []
    for _ in range(5):
        started = clock()
        for _ in range(steps // 5):
            one_step()
        blocks.append((clock() - started) / (steps // 5))
    median = statistics.median(blocks)
    return median, (max(blocks) - min(blocks)) / median
