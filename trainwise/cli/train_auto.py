"""`trainwise train --plan auto` and `--batch-size auto`: choose before training, say what was
chosen and what it is predicted to need, and step down once if the first step still runs out
of memory."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from trainwise.cli.flags import explicit_knobs, number_option, take_auto_batch
from trainwise.common.errors import InputError, OutOfMemory
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
    verify: int = 0  # --verify K: run the top K plans here before choosing
    args: object = None  # the command's arguments (the --verify settings)


def take_auto_request(args) -> AutoRequest:
    """Read (and remove from `args`) --plan auto and --batch-size auto, before the Plan is built."""
    from trainwise.cli.verify_args import verify_count

    auto_plan = getattr(args, "plan", None) == "auto"
    auto_batch = take_auto_batch(args)
    fixed = explicit_knobs(args)
    verify = verify_count(args)
    if verify and not auto_plan:
        raise InputError("--verify", "runs the searched plans, so it goes with --plan auto")
    if auto_plan:
        args.plan = None  # a plan file literally named auto is still reachable as ./auto
    return AutoRequest(plan=auto_plan, batch=auto_batch, global_batch=number_option(args, "global_batch"),
                       margin=number_option(args, "memory_margin", float, 0), fixed=fixed, verify=verify,
                       args=args)


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
    from trainwise.api.search import AUTO_SAMPLES_PER_GPU, auto_global_batch, plan_search
    from trainwise.cli.progress_bar import progress_bar
    from trainwise.emit.train_line import train_flags

    global_batch = request.global_batch
    if global_batch is None and not {"batch_size", "grad_accum"} <= request.fixed:
        global_batch = auto_global_batch(plan.nproc)
        print(f"--plan auto: no --global-batch given: {global_batch} samples per step ({AUTO_SAMPLES_PER_GPU} per "
              f"GPU, the default; --global-batch N to choose)", file=sys.stderr)
    with progress_bar() as progress:
        report = plan_search(model, plan.replace(device=device_name), request.fixed | {"device"},
                             top=max(1, request.verify), global_batch=global_batch, margin=request.margin,
                             gpus=plan.nproc, task=task, trust_remote_code=trust_remote_code, progress=progress)
    best = report.result.ranked[0]
    if request.verify:
        best = _measured_best(request, report, model)
    speed = ("" if math.isnan(best.step_s)
             else f", {best.step_s:.3g} s per step, {best.tokens_per_s:,.0f} tokens/s (job)")
    print(f"--plan auto chose (of {len(report.result.screened)} plans, {report.seconds:.1f} s): predicted "
          f"{human_bytes(best.memory_bytes)} device total{speed}", file=sys.stderr)
    print(f"--plan auto trains: {train_flags(best.plan, model)}", file=sys.stderr)
    return best.plan.replace(device=plan.device)


def _measured_best(request: AutoRequest, report, model: str):
    """Run the top --verify K plans here; the measured best when verify could tell the plans
    apart, else the predicted best (and the verify table says why)."""
    from trainwise.cli.verify_args import run_verify_from_args

    profile = getattr(request.args, "profile", None)
    verified = run_verify_from_args(request.args, model, list(report.result.ranked), report.device, profile)
    ranked = report.result.ranked
    if verified.confident and verified.recommended is not None:
        print(f"--plan auto --verify {request.verify}: training the measured best (plan {verified.recommended + 1})",
              file=sys.stderr)
        return ranked[verified.recommended]
    print(f"--plan auto --verify {request.verify}: no measured winner; training the predicted best", file=sys.stderr)
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
