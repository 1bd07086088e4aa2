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
`step = matmuls + factor x other arithmetic + host x ops`. Matmuls are left at their
isolated rate: profiled on tiny-llama (4 x 256 and 8 x 256 tokens, one thread) a step's
matmuls took about 1.1x their isolated time, attention 1.3x, its element-wise and softmax
work 2-3x (fresh output buffers, operands out of cache), so one factor over all of it
over-prices a model whose step is mostly matmuls. (Leaving attention at its rate too made
the fitted factor rest on a few ms of element-wise work and swing 5.7-7.2 between two
calibrations: too little signal on a shared machine.)

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
HOST_BOUND, COMPUTE_BOUND = (1, 8), (8, 256)


def measure_training_host(device: torch.device, measured: DeviceProfile, settings: Settings) -> tuple[float, float, dict]:
    """(host seconds per op of a training step, the factor by which a training step's
    work other than matmuls runs slower than the rates measured in isolation, what was
    measured), on the CPU. `measured` holds the rates already measured (its host_s_per_op
    is not used). Two reference steps, two unknowns:
    step = matmuls + factor x other arithmetic + host x ops."""
    from trainwise.hardware.resolve import resolve_device
    from trainwise.plan.plan import Plan

    points = []
    for batch_size, seq_len in (HOST_BOUND, COMPUTE_BOUND):
        plan = Plan(batch_size=batch_size, seq_len=seq_len, device="cpu")
        compute_s, matmul_s, ops = predicted_compute_and_ops(plan, resolve_device("cpu"), measured)
        # The small step is a few ms: thrice the steps for as steady a median as the large one's.
        steps = (20 if settings.quick else 60) * (3 if (batch_size, seq_len) == HOST_BOUND else 1)
        step_s, spread = time_training_steps(device, plan, steps=steps)
        points.append({"batch_size": batch_size, "seq_len": seq_len, "step_s": step_s, "arithmetic_s": compute_s,
                       "matmul_s": matmul_s, "ops": ops, "spread": spread})
    host, factor = host_and_factor(*points, least_host_s=measured.host_s_per_op)
    return host, factor, {"what": f"{REFERENCE_MODEL} trained (forward, backward, loss read, clipping, AdamW, zero_grad)"
                                  " at two sizes; step = predicted matmuls + factor x the other predicted arithmetic"
                                  " + host x ops (views a quarter)",
                          "steps": points}


def host_and_factor(small: dict, large: dict, least_host_s: float = 0.0) -> tuple[float, float]:
    """(host seconds per op, factor of the arithmetic other than matmuls) through two
    reference steps, each {"step_s", "arithmetic_s", "matmul_s" (0 if absent), "ops"}: the
    factor is the slope of the step time less its matmuls over the other arithmetic, held
    at >= 1 (a step's kernels do not beat the same kernels timed hot in a loop; a smaller
    slope is noise), and the host time what the smaller step has left per op. An op of a
    training step costs the host at least `least_host_s` (a bare dispatch): a slope that
    leaves less is noise too, and then the host is that floor and the factor what the
    larger step leaves for the arithmetic."""
    def other(point):
        return point["arithmetic_s"] - point.get("matmul_s", 0.0)

    def rest(point):
        return point["step_s"] - point.get("matmul_s", 0.0)

    rise = other(large) - other(small)
    factor = max((rest(large) - rest(small)) / rise if rise > 0 else 1.0, 1.0)
    host = max(rest(small) - factor * other(small), 0.0) / small["ops"]
    if host < least_host_s:
        host = least_host_s
        factor = max((rest(large) - host * large["ops"]) / other(large), 1.0) if other(large) > 0 else 1.0
    return host, factor


def predicted_compute_and_ops(plan, device, measured: DeviceProfile) -> tuple[float, float, float]:
    """(seconds of the step's arithmetic at the measured rates, the matmuls' share of them,
    weighted op count): the time model priced without host time, again with matmuls free
    (attention at its own rate), and once with free arithmetic and 1 s of host per op."""
    from trainwise.estimate.predict import one_device_estimate
    from trainwise.models import resolve_model

    spec = resolve_model(REFERENCE_MODEL)
    free = Rate(per_s=float("inf"))
    arithmetic = dataclasses.replace(measured, host_s_per_op=0.0, step_compute_factor=1.0, step_non_matmul_factor=1.0)
    without_host = one_device_estimate(spec, plan, device, profile=arithmetic).time.step_s
    free_matmuls = dataclasses.replace(arithmetic, matmul={name: free for name in measured.matmul})
    without_matmuls = one_device_estimate(spec, plan, device, profile=free_matmuls).time.step_s
    counting = dataclasses.replace(measured, host_s_per_op=1.0, memory=free, attention={}, transcendental=None,
                                   matmul={name: free for name in measured.matmul}, corrections={})
    ops = one_device_estimate(spec, plan, device, profile=counting).time.breakdown["host_overhead"]
    return without_host, without_host - without_matmuls, ops


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
