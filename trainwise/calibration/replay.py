"""How much slower a training step runs its matmuls and attention than the same ops alone.

The profile's matmul and attention rates are timed one kernel at a time in a loop, its
operands hot in cache. In a training step each contraction reads what the previous ops
just wrote and evicted, and its time per FLOP is higher. This measures that directly,
where a fit over whole steps could not separate it from the element-wise work: the
reference step runs under a dispatch mode that times each matmul and attention op as the
step runs it, then runs the same op again at once, twice, with the same operands (now
hot), and keeps the faster replay. The factor is the step's total over the replays'
total: the same shapes on both sides, so it holds the step's slowdown alone, not how
fast these shapes are (the profile's rates price that), and both sides share the
moment's machine load."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainwise.calibration.timing import clock_of, synchronizer
from trainwise.trace.op_costs import classify

CONTRACTION_CLASSES = ("matmul", "attention")
STEPS_TIMED = 3


class _ContractionTimer(TorchDispatchMode):
    """Adds each contraction's seconds in the step and its best of two hot replays."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.in_step_s, self.replayed_s, self.ops = clock, 0.0, 0.0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if classify(func) not in CONTRACTION_CLASSES:
            return func(*args, **kwargs)
        started = self.clock()
        out = func(*args, **kwargs)
        self.in_step_s += self.clock() - started
        replays = []
        for _ in range(2):
            started = self.clock()
            func(*args, **kwargs)
            replays.append(self.clock() - started)
        self.replayed_s += min(replays)
        self.ops += 1
        return out


def contraction_from(in_step_s: float, replayed_s: float) -> tuple[float, float]:
    """(the factor, the measured ratio): in-step over replayed seconds, the factor held at
    >= 1 (a step's kernels do not beat the same kernels hot; below is noise)."""
    ratio = in_step_s / replayed_s if replayed_s > 0 else 1.0
    return max(ratio, 1.0), ratio


def contraction_factor(device: torch.device, plan) -> tuple[float, dict]:
    """(in-step seconds / hot-replay seconds of the reference step's matmul and attention
    ops under `plan`, held at >= 1; what was measured). CPU only: on a GPU the clock would
    need a synchronisation around every op."""
    from trainwise.calibration.host_time import reference_step

    one_step = reference_step(device, plan)
    for _ in range(3):
        one_step()  # warm-up: the optimizer's state, the allocator's caches
    timer = _ContractionTimer(clock_of(synchronizer(device)))
    with timer:
        for _ in range(STEPS_TIMED):
            one_step()
    factor, ratio = contraction_from(timer.in_step_s, timer.replayed_s)
    return factor, {"what": "the reference step's matmul and attention ops, timed in the step and replayed "
                                     "at once with hot operands (best of 2)",
                             "batch_size": plan.batch_size, "seq_len": plan.seq_len,
                             "in_step_s": timer.in_step_s / STEPS_TIMED, "replayed_s": timer.replayed_s / STEPS_TIMED,
                             "ops": timer.ops // STEPS_TIMED, "ratio": ratio}
