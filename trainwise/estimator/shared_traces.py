"""Traced steps one plan search shares between its estimates.

A plan and its --compile twin trace the same step: compile changes what the ops cost (the
compiled regions' element-wise chains as fused kernels, trainwise/trace/fusion.py), not
which ops run or what they allocate (a compiled plan's memory figures are the eager
step's). A one-device estimate given a `SharedTraces` therefore prices its trace both ways
and keeps it, and an estimate of the twin takes it instead of tracing again: the search's
compile refinement (trainwise/search/refine.py) asks for the compiled twins of plans it has
just estimated exactly. The twin's estimate is the one a fresh trace would give
(tests/test_compile_time.py)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, TypeVar

from trainwise.hardware import Device
from trainwise.models import ModelSpec
from trainwise.plan.plan import Plan

Step = TypeVar("Step")
# Steps kept, the least recently used dropped first: the refinement asks for a twin within a
# few estimates of its plan's (search/refine.py: the effect estimates and the confirmation
# of the refinement before it), and each step is a few small traces (2-3 blocks).
KEPT_STEPS = 8


class SharedTraces:
    """The last KEPT_STEPS traced steps, by what decides the trace: the model, every knob of
    the plan but `compile`, and the device. `reused` counts the estimates that took one."""

    def __init__(self, kept: int = KEPT_STEPS):
        self.kept = kept
        self.reused = 0
        self._steps: OrderedDict[tuple, tuple[ModelSpec, object]] = OrderedDict()

    def step(self, spec: ModelSpec, plan: Plan, device: Device, trace: Callable[[], Step]) -> Step:
        """The step traced for `plan` or its compile twin, else `trace()` (kept)."""
        key = (id(spec), plan.replace(compile=False), device)
        kept = self._steps.get(key)
        if kept is not None and kept[0] is spec:  # the spec is held, so its id is not reused
            self._steps.move_to_end(key)
            self.reused += 1
            return kept[1]
        step = trace()
        self._steps[key] = (spec, step)
        while len(self._steps) > self.kept:
            self._steps.popitem(last=False)
        return step
