"""`--batch-size auto`: the largest micro-batch predicted to fit, keeping a given global
batch by accumulation. Memory grows with the micro-batch, so a bisection over the allowed
sizes needs a handful of estimates; each is an exact estimate of that very plan."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.api.estimate import estimate
from trainwise.api.search import capacity_of
from trainwise.common.errors import InputError
from trainwise.common.units import human_bytes
from trainwise.hardware import resolve_device
from trainwise.models import ModelSpec
from trainwise.search.screen_and_confirm import DEFAULT_MARGIN, data_parallel_of
from trainwise.search.space import batch_options
from trainwise.plan.plan import Plan


@dataclass(frozen=True)
class AutoBatch:
    """plan: with the chosen batch_size and grad_accum; smaller: the next size down (the one
    step down after an out-of-memory), None when there is none; line: what was picked and why."""

    plan: Plan
    smaller: Plan | None
    line: str


def largest_fitting_batch(spec: ModelSpec, plan: Plan, *, global_batch: int | None = None,
                          margin: float = DEFAULT_MARGIN, capacity_bytes: int | None = None,
                          accum_fixed: bool = False) -> AutoBatch:
    """The largest micro-batch of `plan` whose predicted device total fits
    capacity x (1 - margin) (bytes; default capacity: the plan's device). With `global_batch`,
    micro-batch x accumulation x data-parallel replicas equals it; else the accumulation stays."""
    if not 0 <= margin < 1:
        raise InputError("--memory-margin", f"must be a fraction in [0, 1) (got {margin})")
    capacity = capacity_bytes if capacity_bytes is not None else capacity_of(resolve_device(plan.device))
    usable = int(capacity * (1 - margin))
    fixed = frozenset({"grad_accum"} if accum_fixed else ())
    options = batch_options(plan, fixed, global_batch, data_parallel_of(plan))
    need = {}

    def memory(index: int) -> int:
        if index not in need:
            mb, accum = options[index]
            need[index] = estimate(spec, plan.replace(batch_size=mb, grad_accum=accum, compile=False)).memory.device_total
        return need[index]

    low, high = -1, len(options) - 1  # options[low] fits (-1: none yet); answer in (low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if memory(middle) <= usable:
            low = middle
        else:
            high = middle - 1
    if low < 0:
        raise InputError("--batch-size", f"auto: even micro-batch {options[0][0]} needs {human_bytes(memory(0))} "
                                         f"(predicted) of {human_bytes(usable)} usable; add --grad-ckpt, a shorter "
                                         "--seq-len or --lora-rank 16, or see `trainwise plan`")
    return _picked(plan, options, low, need, usable)


def _picked(plan: Plan, options, index: int, need: dict, usable: int) -> AutoBatch:
    mb, accum = options[index]
    chosen = plan.replace(batch_size=mb, grad_accum=accum)
    smaller = plan.replace(batch_size=options[index - 1][0], grad_accum=options[index - 1][1]) if index else None
    larger = f"; {options[index + 1][0]} would need {human_bytes(need[index + 1])}" if index + 1 in need else ""
    line = (f"--batch-size auto picked {mb} (x {accum} accumulation): predicted {human_bytes(need[index])} of "
            f"{human_bytes(usable)} usable{larger}")
    return AutoBatch(plan=chosen, smaller=smaller, line=line)
