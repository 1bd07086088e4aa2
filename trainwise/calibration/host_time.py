"""A real training step's host time per op and arithmetic factor, for the CPU's time model.

A tiny eager `torch.add` in a loop costs the dispatcher about 1.5 us on a small CPU; an op
of a training step costs the host far more: autograd records a graph node for it in
forward and runs that node in backward, the model's Python (module calls, masks, rotary
tables) runs around it, the loop makes the batch and clips. And a training
step's kernels run slower than the same kernels timed alone in a loop, with their operands
hot in cache. Both are measured where they happen: the catalog's tiny-llama is trained as
trainwise's step does it (a fresh batch, forward with the loss, backward, gradient
clipping, AdamW foreach, the LR schedule, zero_grad) at two sizes, one whose
arithmetic is a few percent of the step and one whose arithmetic is most of it (a block of
each in turn between each of calibrate's rate measurements, so that the steps meet the
speed the rates were measured at: reference_steps); with the
arithmetic the time model prices at the rates measured in isolation, and the ops the
traced step dispatches (views at a quarter), the two steps give the two unknowns:
`step = fixed + factor x other arithmetic + host x ops`, where `fixed` is the work
measured by other means: matmuls and attention at their isolated rates times the
contraction factor (replay.py: each of a step's matmul and attention ops timed
in the step and replayed at once, hot; 1.2-1.6x on a 2-core EPYC, the same for
tiny-llama and 4-layer models 3-4x wider, while element-wise work ran 5-10x its replay),
and the optimizer phase at the rate of a real AdamW step (memory.py). One
factor over all of it, as before, gave attention the element-wise work's slowdown (2.5x
where a step runs it 1.2-1.7x) and the optimizer the memory rate's (it runs 4-5x slower):
over-predicting attention-heavy plans, under-predicting optimizer- and matmul-heavy ones.
Three more steps, timed side by side in interleaved blocks at 2 x 64 tokens (plain, with
full checkpointing, with selective), price the host time of a recomputed op (its
dispatch, the checkpoint's saved-tensor hooks, the block's Python run again; on the CPU
2-4x a plain op's, which the recomputed ops alone missed by 20-40 %) from what each
checkpointed step adds to the plain one, so that what the model gets wrong about the
plain step cancels. Selective checkpointing gets its own figure: its policy runs in
Python for every op of a checkpointed block, forward and recompute
(torch.utils.checkpoint's selective dispatch mode), which pricing it like full's
recompute host missed.

The step's time is wall time at the process's thread count, as `trainwise train` times a
step (timing.py: Synchronizer)."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainwise.calibration.timing import Settings, clock_of, synchronizer
from trainwise.hardware.profile import DeviceProfile, Rate

REFERENCE_MODEL = "tiny-llama"
# (batch, tokens) of the two reference steps: one whose arithmetic is a few percent of the
# step (sets the host time per op), one whose arithmetic is most of it (sets the factor).
HOST_BOUND, COMPUTE_BOUND = (1, 8), (8, 256)
# (batch, tokens) of the checkpointed steps and their plain twin: the sequence length the
# time-model page runs, two sequences. The 1 x 8-token step the figure was read from
# before did not carry to the sizes users run (checkpointed plans at 64 tokens read
# 50-57 % high).
CHECKPOINTED = (2, 64)
# Blocks each reference step is timed in, the two steps' blocks taken in turn.
REFERENCE_BLOCKS = 5


class InterleavedSteps:
    """Training steps of the reference model under each of `plans`, built and warmed once,
    then timed a block of each at a time, in turn (A, B, A, B, ...), whenever the caller
    asks: a load that comes and goes slows all of them alike, and block i of one plan may
    be compared with block i of another. `counts`: steps per block, one per plan."""

    def __init__(self, device: torch.device, plans: list, counts: list[int], model=REFERENCE_MODEL):
        self.plans, self.counts = plans, counts
        self.steps = [reference_step(device, plan, model) for plan in plans]
        self.clock = clock_of(synchronizer(device))
        for one_step in self.steps:
            for _ in range(5):
                one_step()  # warm-up: the optimizer's state, the allocator's caches
        self.blocks: list[list[float]] = [[] for _ in plans]  # seconds per step, per block
        self.taken_at: list[float] = []  # seconds since the steps were built, per block
        self.started = self.clock()

    def time_block(self) -> None:
        """One block of each plan's step, in turn."""
        self.taken_at.append(round(self.clock() - self.started, 2))
        for one_step, timed, count in zip(self.steps, self.blocks, self.counts):
            started = self.clock()
            for _ in range(count):
                one_step()
            timed.append((self.clock() - started) / count)

    def taken(self) -> int:
        return len(self.taken_at)


def reference_steps(device: torch.device, settings: Settings) -> InterleavedSteps:
    """The two reference steps (HOST_BOUND, COMPUTE_BOUND), ready to be timed a block of each
    wherever the caller asks: calibrate takes a block between each of its rate
    measurements. The factor compares the steps with those rates, and on a VM whose speed
    moves over tens of seconds (this project's 2-core one: the 8 x 256 step 30-42 ms in
    back-to-back processes) steps timed in one spell and rates in another put the whole
    change on the factor, the small part of the large step it prices: two quiet
    calibrations ten minutes apart fitted 2.97 and 7.84. Spread over the span the rates
    were measured in, the steps' medians meet the rates' speed. Each block times both
    steps, so their difference, which sets the factor, meets one speed too."""
    from trainwise.plan.plan import Plan

    sizes = (HOST_BOUND, COMPUTE_BOUND)
    return InterleavedSteps(device, [Plan(batch_size=b, seq_len=t, device="cpu") for b, t in sizes],
                            [max(1, steps_timed(settings, size) // REFERENCE_BLOCKS) for size in sizes])


def measure_training_host(device: torch.device, measured: DeviceProfile, settings: Settings,
                          reference: InterleavedSteps | None = None) -> tuple[DeviceProfile, dict]:
    """`measured` (the rates already measured; its host_s_per_op is not used) with what a
    training step adds, on the CPU: the contraction factor, the host seconds per op, the
    factor by which the step's other work (not contractions, not the optimizer) runs slower
    than its rates, and the host seconds of a recomputed op; and what was measured. Two
    reference steps, two unknowns: step = fixed + factor x other arithmetic + host x ops;
    the steps' blocks are those `reference` took while the rates were measured, topped up
    here to REFERENCE_BLOCKS (all of them here without one)."""
    from trainwise.hardware.resolve import resolve_device
    from trainwise.plan.plan import Plan

    from trainwise.calibration.replay import contraction_factor

    contraction, replayed = contraction_factor(device, Plan(batch_size=COMPUTE_BOUND[0], seq_len=COMPUTE_BOUND[1],
                                                            device="cpu"))
    measured = dataclasses.replace(measured, step_contraction_factor=contraction)
    reference = reference or reference_steps(device, settings)
    while reference.taken() < REFERENCE_BLOCKS:
        reference.time_block()
    points = []
    for plan, timed in zip(reference.plans, reference.blocks):
        compute_s, fixed_s, ops = predicted_compute_and_ops(plan, resolve_device("cpu"), measured)
        points.append({"batch_size": plan.batch_size, "seq_len": plan.seq_len, "step_s": statistics.median(timed),
                       "arithmetic_s": compute_s, "fixed_s": fixed_s, "ops": ops, "spread": spread(timed),
                       "blocks_s": timed, "blocks_at_s": reference.taken_at})
    host, factor = host_and_factor(*points, least_host_s=measured.host_s_per_op)
    fitted = dataclasses.replace(measured, host_s_per_op=host, step_non_matmul_factor=factor)
    recomputed, selective = _recomputed_op_hosts(device, fitted, settings)
    fitted = dataclasses.replace(fitted, host_s_per_recomputed_op=recomputed["host_s_per_recomputed_op"],
                                 host_s_per_selective_recomputed_op=selective["host_s_per_recomputed_op"])
    return fitted, {"what": f"{REFERENCE_MODEL} trained (forward, backward, clipping, AdamW, zero_grad)"
                                  " at two sizes; step = predicted matmuls and attention (x the contraction factor)"
                                  " and optimizer + factor x the other predicted arithmetic + host x ops (views a"
                                  " quarter); a recomputed op's host time under full, then selective checkpointing:"
                                  f" {CHECKPOINTED[0]} x {CHECKPOINTED[1]} tokens with that checkpointing less the same"
                                  " without it (timed in interleaved blocks) less the predicted rise, over the"
                                  " recomputed ops",
                    "steps": points, "recomputed": recomputed, "selective_recomputed": selective,
                    "contraction": replayed}


def steps_timed(settings: Settings, size: tuple[int, int]) -> int:
    """Steps to time of a reference step of `size` (HOST_BOUND or COMPUTE_BOUND): the
    small step is a few ms, thrice the steps for as steady a median."""
    return (20 if settings.quick else 60) * (3 if size == HOST_BOUND else 1)


def _recomputed_op_hosts(device: torch.device, fitted: DeviceProfile, settings: Settings) -> tuple[dict, dict]:
    """The host seconds of an op that checkpointing recomputes, under the full and the
    selective policy: each checkpointed step less the same plan without checkpointing,
    timed side by side (interleaved blocks: what drifts on a busy machine drifts under
    both), less the rise the time model predicts with a recomputed op's host time at 0,
    over the recomputed ops (views a quarter); at least a plain op's. A difference of two
    measured steps leaves out what the model gets wrong about the plain step: read as the
    checkpointed step less its whole prediction, that error landed on the recomputed ops
    (tiny-llama's full figure doubled between two quiet calibrations, and checkpointed
    plans read 50-57 % high). Under the selective policy the figure also carries the
    policy's Python dispatch of the block's forward ops (as many per block as it
    recomputes, and the kept matmuls), which is why it is measured apart."""
    from trainwise.hardware.resolve import resolve_device
    from trainwise.plan.plan import Plan

    cpu = resolve_device("cpu")
    plain = Plan(batch_size=CHECKPOINTED[0], seq_len=CHECKPOINTED[1], device="cpu")
    policies = {"full": "host_s_per_recomputed_op", "selective": "host_s_per_selective_recomputed_op"}
    plans = [plain] + [plain.replace(grad_ckpt=True, grad_ckpt_policy=policy) for policy in policies]
    blocks = time_interleaved_steps(device, plans, *interleaved_blocks(settings))
    predicted_plain = priced_under_profiles(plain, cpu, [fitted])[0].time.step_s
    found = []
    for (policy, field), plan, timed in zip(policies.items(), plans[1:], blocks[1:]):
        free, unit = (priced.time.step_s for priced in priced_under_profiles(plan, cpu, [
            dataclasses.replace(fitted, **{field: h}) for h in (0.0, 1.0)]))
        rises = [checkpointed - alone for checkpointed, alone in zip(timed, blocks[0])]
        rise = statistics.median(rises)
        ops = unit - free
        found.append({"policy": policy, "batch_size": plain.batch_size, "seq_len": plain.seq_len,
                      "step_s": statistics.median(timed), "spread": spread(timed),
                      "plain_step_s": statistics.median(blocks[0]), "plain_spread": spread(blocks[0]),
                      "measured_rise_s": rise, "rise_spread": spread(rises),
                      "predicted_without_recomputed_host_s": free, "predicted_plain_s": predicted_plain,
                      "recomputed_ops": ops,
                      "host_s_per_recomputed_op": recomputed_op_host(rise, free - predicted_plain, ops,
                                                                     fitted.host_s_per_op)})
    return found[0], found[1]


def recomputed_op_host(measured_rise_s: float, predicted_rise_s: float, ops: float, least_host_s: float) -> float:
    """Host seconds per recomputed op: what checkpointing added to the measured step
    (`measured_rise_s`, the checkpointed step less the plain one) beyond what the time
    model prices without their host time (`predicted_rise_s`: the recomputed arithmetic,
    the checkpoint's other work), over the `ops` it recomputes; held at `least_host_s` (a
    plain op's host time: a recomputed op runs the same dispatch and more)."""
    return max((measured_rise_s - predicted_rise_s) / ops if ops > 0 else 0.0, least_host_s)


def interleaved_blocks(settings: Settings) -> tuple[int, int]:
    """(blocks, steps per block) of each plan of an interleaved comparison (the checkpointing
    one here, the compiled steps' in calibration/compiled_steps.py): 128 steps of
    each of three plans, about the time the 1 x 8 checkpointed steps read before took (180
    of each of two, 13 and 24 ms on the quiet time-model page; in this process's CPU
    seconds at one thread on a busy 2-core EPYC the three 2 x 64 steps ran 9, 12 and 17 ms,
    the two 1 x 8 ones 8-10 and 17 ms). Many short blocks: many pairs for the median of
    the per-block differences."""
    return (6, 3) if settings.quick else (16, 8)


def spread(values: list[float]) -> float:
    """(max - min) / |median|: the spread a profile records (inf for a median of 0)."""
    median = abs(statistics.median(values))
    return (max(values) - min(values)) / median if median else float("inf")


def priced_under_profiles(plan, device, profiles: list[DeviceProfile], model=REFERENCE_MODEL) -> list:
    """The reference model's estimate of `plan` under each of `profiles`: traced once,
    priced once per profile (estimator/step_time.py: price_step)."""
    from trainwise.estimator.predict import one_device_estimate
    from trainwise.estimator.step_time import price_step
    from trainwise.models import resolve_model

    spec = model if not isinstance(model, str) else resolve_model(model)
    traced = one_device_estimate(spec, plan, device, profile=profiles[0])
    return [traced] + [dataclasses.replace(traced, time=price_step(traced.work, plan, device, profile, spec.name))
                       for profile in profiles[1:]]


def host_and_factor(small: dict, large: dict, least_host_s: float = 0.0) -> tuple[float, float]:
    """(host seconds per op, factor of the arithmetic other than the fixed part) through two
    reference steps, each {"step_s", "arithmetic_s", "fixed_s" (the work priced by other
    means: contractions, optimizer; 0 if absent), "ops"}: the factor is the slope of the
    step time less its fixed part over the other arithmetic, held
    at >= 1 (a step's kernels do not beat the same kernels timed hot in a loop; a smaller
    slope is noise), and the host time what the smaller step has left per op. An op of a
    training step costs the host at least `least_host_s` (a bare dispatch): a slope that
    leaves less is noise too, and then the host is that floor and the factor what the
    larger step leaves for the arithmetic."""
    def other(point):
        return point["arithmetic_s"] - point.get("fixed_s", 0.0)

    def rest(point):
        return point["step_s"] - point.get("fixed_s", 0.0)

    rise = other(large) - other(small)
    factor = max((rest(large) - rest(small)) / rise if rise > 0 else 1.0, 1.0)
    host = max(rest(small) - factor * other(small), 0.0) / small["ops"]
    if host < least_host_s:
        host = least_host_s
        factor = max((rest(large) - host * large["ops"]) / other(large), 1.0) if other(large) > 0 else 1.0
    return host, factor


def predicted_compute_and_ops(plan, device, measured: DeviceProfile) -> tuple[float, float, float]:
    """(seconds of the step's arithmetic at the measured rates, the part of them not scaled
    by step_non_matmul_factor: contractions x their factor and the optimizer, weighted op
    count): the time model priced without host time, again with step_non_matmul_factor 0,
    and once with free arithmetic and 1 s of host per op."""
    free = Rate(per_s=float("inf"))
    arithmetic = dataclasses.replace(measured, host_s_per_op=0.0, host_s_per_recomputed_op=None,
                                     step_compute_factor=1.0, step_non_matmul_factor=1.0)
    fixed_only = dataclasses.replace(arithmetic, step_non_matmul_factor=0.0)
    counting = dataclasses.replace(measured, host_s_per_op=1.0, host_s_per_recomputed_op=None, memory=free,
                                   attention={}, attention_by_head_dim={}, transcendental=None, optimizer=None,
                                   matmul={name: free for name in measured.matmul}, corrections={})
    priced = priced_under_profiles(plan, device, [arithmetic, fixed_only, counting])
    without_host, fixed = priced[0].time.step_s, priced[1].time.step_s
    ops = priced[2].time.breakdown["host_overhead"]
    return without_host, fixed, ops


def time_training_steps(device: torch.device, plan, steps: int) -> tuple[float, float]:
    """(median seconds of one training step, (max - min) / median over blocks of steps)."""
    blocks = time_interleaved_steps(device, [plan], REFERENCE_BLOCKS, steps // REFERENCE_BLOCKS)[0]
    return statistics.median(blocks), spread(blocks)


def time_interleaved_steps(device: torch.device, plans: list, blocks: int, steps: int,
                           model=REFERENCE_MODEL) -> list[list[float]]:
    """Seconds per training step of each of `plans`, one list per plan of `blocks` blocks of
    `steps` steps each, the plans' blocks taken in turn (InterleavedSteps); `model` as
    reference_step takes it."""
    interleaved = InterleavedSteps(device, plans, [steps] * len(plans), model)
    for _ in range(blocks):
        interleaved.time_block()
    return interleaved.blocks


def reference_step(device: torch.device, plan, model: str = REFERENCE_MODEL):
    """One training step of `model` (a catalog name or a ModelSpec; the reference model
    unless told) under `plan`, as trainwise's step runs it (the plan's checkpointing and
    compilation applied): a function that runs it once (the first run compiles)."""
    from trainwise.engine.compile_regions import compile_model_parts
    from trainwise.engine.schedule import build_scheduler
    from trainwise.models import build_model, example_batch, resolve_model
    from trainwise.techniques.optimizers import build_optimizer
    from trainwise.techniques.precision import precision_policy
    from trainwise.techniques.recipe import compute_loss, prepare_model

    spec = model if not isinstance(model, str) else resolve_model(model)
    torch.manual_seed(0)
    model = build_model(spec, device=device, batch_size=plan.batch_size, seq_len=plan.seq_len)
    model = prepare_model(model, plan, precision_policy(plan.precision, device.type))
    optimizer = build_optimizer(plan, model, device.type)
    scheduler = build_scheduler(optimizer, 10**6, 0, plan.lr_schedule)
    forward = compile_model_parts([model], plan, in_place=False)[0]  # the model itself without --compile

    def one_step():
        batch = {k: v.to(device) for k, v in example_batch(spec, plan.batch_size, plan.seq_len).items()}
        loss = compute_loss(forward, batch)
        loss.backward()
        # Nothing is read back: trainwise's loop leaves the loss and the gradient norm on
        # the device and reads them every --log-every steps (engine/pending_steps.py).
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), plan.max_grad_norm, foreach=True)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return one_step
