"""`trainwise train --plan auto` and `--batch-size auto`: choose before training, say what was
chosen and what it is predicted to need, and step down once if the first step still runs out
of memory."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from trainwise.cli.flags import explicit_knobs, number_option, take_auto_batch
from trainwise.common.errors import OutOfMemory
from trainwise.common.units import human_bytes
from trainwise.plan.plan import Plan


@dataclass
class AutoRequest:
    """What the user left to trainwise: the whole plan, or the micro-batch."""

    plan: bool
    batch: bool
    global_batch: int | None
    margin: float
    fixed: frozenset[str]
    smaller: Plan | None = None  # the one step down, for --batch-size auto


def take_auto_request(args) -> AutoRequest:
    """Read (and remove from `args`) --plan auto and --batch-size auto, before the Plan is built."""
    auto_plan = getattr(args, "plan", None) == "auto"
    auto_batch = take_auto_batch(args)
    fixed = explicit_knobs(args)
    if auto_plan:
        args.plan = None  # a plan file literally named auto is still reachable as ./auto
    return AutoRequest(plan=auto_plan, batch=auto_batch, global_batch=number_option(args, "global_batch"),
                       margin=number_option(args, "memory_margin", float, 0), fixed=fixed)


def resolve_auto(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code) -> Plan:
    """The plan to train: searched (--plan auto) or with the largest fitting micro-batch
    (--batch-size auto), predicted for `device_name` (the device present)."""
    if request.plan:
        return _searched(request, plan, model, device_name, task, trust_remote_code)
    if not request.batch:
        return plan
    from trainwise.api.batch_auto import largest_fitting_batch
    from trainwise.models import resolve_model

    spec = resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    picked = largest_fitting_batch(spec, plan.replace(device=device_name), global_batch=request.global_batch,
                                   margin=request.margin, accum_fixed="grad_accum" in request.fixed)
    print(picked.line, file=sys.stderr)
    request.smaller = picked.smaller.replace(device=plan.device) if picked.smaller else None
    return picked.plan.replace(device=plan.device)


def _searched(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code) -> Plan:
    from trainwise.api.plan import plan_search
    from trainwise.planner.emit import train_flags

    report = plan_search(model, plan.replace(device=device_name), request.fixed | {"device"}, top=1,
                         global_batch=request.global_batch, margin=request.margin, gpus=plan.nproc, task=task,
                         trust_remote_code=trust_remote_code)
    best = report.result.ranked[0]
    speed = "" if math.isnan(best.step_s) else f", {best.step_s:.3g} s per step, {best.tokens_per_s:,.0f} tokens/s"
    print(f"--plan auto chose (of {len(report.result.screened)} plans, {report.seconds:.1f} s): predicted "
          f"{human_bytes(best.memory_bytes)} device total{speed}", file=sys.stderr)
    print(f"--plan auto trains: {train_flags(best.plan, model)}", file=sys.stderr)
    return best.plan.replace(device=plan.device)


def train_stepping_down(request: AutoRequest, plan: Plan, run_train, steps_done) -> object:
    """run_train(plan); under --batch-size auto, an out-of-memory before the first step ends
    is retried once with the next smaller micro-batch (never more: a loop could hide a
    prediction that is badly wrong)."""
    try:
        return run_train(plan)
    except OutOfMemory:
        if not request.batch or request.smaller is None or steps_done() > 0:
            raise
    print(f"--batch-size auto: micro-batch {plan.batch_size} ran out of memory in the first step; trying "
          f"{request.smaller.batch_size} (x {request.smaller.grad_accum} accumulation) once", file=sys.stderr)
    return run_train(request.smaller)
