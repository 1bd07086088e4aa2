"""`trainwise train --plan auto` and `--batch-size auto`, decided: choose before training, say
what was chosen and what it is predicted to need (through `say`: the command line prints it),
pin the choice into the workers' command line, and step down once if the first step still
runs out of memory. Reading the flags into an `AutoRequest` is the command line's
(`cli/train_auto.py`)."""

from __future__ import annotations

import math
from typing import Callable

from trainwise.common.errors import OutOfMemory
from trainwise.common.units import human_bytes
from trainwise.plan.auto_request import AutoRequest
from trainwise.plan.plan import Plan


def resolve_auto(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code, *,
                 say: Callable[[str], None], progress=None) -> Plan:
    """The plan to train: searched (--plan auto) or with the largest fitting micro-batch
    (--batch-size auto), predicted for `device_name` (the device present). `progress`: a
    context manager yielding the search's Progress."""
    if request.plan:
        return _searched(request, plan, model, device_name, task, trust_remote_code, say, progress)
    if not request.batch:
        return plan
    from trainwise.api.batch_auto import largest_fitting_batch
    from trainwise.models import resolve_model

    spec = resolve_model(model, task=task, trust_remote_code=trust_remote_code)
    picked = largest_fitting_batch(spec, plan.replace(device=device_name), global_batch=request.global_batch,
                                   margin=request.margin, accum_fixed="grad_accum" in request.fixed)
    say(picked.line)
    request.smaller = picked.smaller.replace(device=plan.device) if picked.smaller else None
    return picked.plan.replace(device=plan.device)


def _searched(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code, say,
              progress) -> Plan:
    from contextlib import nullcontext

    from trainwise.api.search import AUTO_SAMPLES_PER_GPU, auto_global_batch, plan_search
    from trainwise.common.progress import silent
    from trainwise.emit.train_line import train_flags

    global_batch = request.global_batch
    if global_batch is None and not {"batch_size", "grad_accum"} <= request.fixed:
        global_batch = auto_global_batch(plan.nproc)
        say(f"--plan auto: no --global-batch given: {global_batch} samples per step ({AUTO_SAMPLES_PER_GPU} per "
            f"GPU, the default; --global-batch N to choose)")
    with (progress if progress is not None else nullcontext(silent)) as shown:
        report = plan_search(model, plan.replace(device=device_name), request.fixed | {"device"},
                             top=max(1, request.verify), global_batch=global_batch, margin=request.margin,
                             gpus=plan.nproc, task=task, trust_remote_code=trust_remote_code, progress=shown)
    best = report.result.ranked[0]
    if request.verify:
        best = _measured_best(request, report, model, say)
    speed = ("" if math.isnan(best.step_s)
             else f", {best.step_s:.3g} s per step, {best.tokens_per_s:,.0f} tokens/s (job)")
    say(f"--plan auto chose (of {len(report.result.screened)} plans, {report.seconds:.1f} s): predicted "
        f"{human_bytes(best.memory_bytes)} device total{speed}")
    say(f"--plan auto trains: {train_flags(best.plan, model)}")
    return best.plan.replace(device=plan.device)


def _measured_best(request: AutoRequest, report, model: str, say):
    """Run the top --verify K plans here; the measured best when verify could tell the plans
    apart, else the predicted best (and the verify table says why)."""
    verified = request.run_verify(model, list(report.result.ranked), report.device)
    ranked = report.result.ranked
    if verified.confident and verified.recommended is not None:
        say(f"--plan auto --verify {request.verify}: training the measured best (plan {verified.recommended + 1})")
        return ranked[verified.recommended]
    say(f"--plan auto --verify {request.verify}: no measured winner; training the predicted best")
    return ranked[0]


def pinned_argv(argv: list[str], plan: Plan, request: AutoRequest) -> list[str]:
    """The command line the torchrun workers run: what auto chose, written out as flags, so
    each rank trains the parent's choice instead of searching again."""
    drop = {"--plan": "auto", "--batch-size": "auto"} if request.plan else {"--batch-size": "auto"}
    kept, skip = [], False
    for index, word in enumerate(argv):
        if skip:
            skip = False
            continue
        name, _, inline = word.partition("=")
        if name in drop and (inline or (argv[index + 1] if index + 1 < len(argv) else "")) == drop[name]:
            skip = not inline
            continue
        kept.append(word)
    pinned = {"batch_size": plan.batch_size, "grad_accum": plan.grad_accum}
    if request.plan:
        pinned.update(plan.changed_knobs())
    for name, value in pinned.items():
        if name in ("device", "nproc") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        kept += [flag] if value is True else [flag, str(value)]
    return kept


def train_stepping_down(request: AutoRequest, plan: Plan, run_train, steps_done, say: Callable[[str], None]) -> object:
    """run_train(plan); under --batch-size auto, an out-of-memory before the first step ends
    is retried once with the next smaller micro-batch (never more: a loop could hide a
    prediction that is badly wrong)."""
    try:
        return run_train(plan)
    except OutOfMemory:
        if not request.batch or request.smaller is None or steps_done() > 0:
            raise
    say(f"--batch-size auto: micro-batch {plan.batch_size} ran out of memory in the first step; trying "
        f"{request.smaller.batch_size} (x {request.smaller.grad_accum} accumulation) once")
    return run_train(request.smaller)
