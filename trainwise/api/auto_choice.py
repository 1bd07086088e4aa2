"""`trainwise train --plan auto` and `--batch-size auto`, decided: choose before training, say
what was chosen and what it is predicted to need (through `say`: the command line prints it),
pin the choice into the workers' command line, and step down once if the first step still
runs out of memory. Reading the flags into an `AutoRequest` is the command line's
(`cli/train_auto.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from trainwise.common.errors import InputError, OutOfMemory
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


def data_rows(run_config, seq_len: int) -> int | None:
    """The sequences of `seq_len` tokens the run's data holds at least, when cheap to know
    before the search (engine/data/row_count.py); None when not."""
    from trainwise.engine.data.row_count import rows_at_least

    return rows_at_least(run_config.data, run_config.tokenizer, run_config.chat, seq_len)


@dataclass(frozen=True)
class SearchScope:
    """What `--plan auto` searches: the job's GPUs (all nodes), GPUs per node when there
    are several, and the global batch (None: the search's own choice); `line` says a
    default chosen for the user."""

    gpus: int
    gpus_per_node: int | None
    global_batch: int | None
    line: str | None


def search_scope(request: AutoRequest, nproc: int) -> SearchScope:
    """The job is --nnodes x --nproc GPUs (each node runs `nproc`): the layout is searched
    for all of them and the default global batch is AUTO_SAMPLES_PER_GPU per GPU of the job,
    cut to what the data holds (each rank's micro-batch needs rows of its own). InputError
    when the data cannot give every rank one row."""
    from trainwise.api.search import AUTO_SAMPLES_PER_GPU, auto_global_batch

    gpus = request.nnodes * nproc
    per_node = nproc if request.nnodes > 1 else None
    rows = request.rows
    if rows is not None and rows < gpus:
        raise InputError("--data", f"holds about {rows} training sequence(s) of --seq-len tokens, fewer than the "
                                   f"job's {gpus} process(es) need (one each); lower --seq-len or add data")
    if request.global_batch is not None or {"batch_size", "grad_accum"} <= request.fixed:
        return SearchScope(gpus, per_node, request.global_batch, None)
    wanted = auto_global_batch(gpus)
    bounded = wanted if rows is None else min(wanted, rows // gpus * gpus)
    cut = (f"; cut to {bounded} because --data holds at least {rows} sequences and no more are known"
           if bounded < wanted else "")
    return SearchScope(gpus, per_node, bounded,
                       f"--plan auto: no --global-batch given: {bounded} samples per step ({AUTO_SAMPLES_PER_GPU} per "
                       f"GPU, the default" + (f", x {gpus} GPUs" if gpus > 1 else "")
                       + f"{cut}; --global-batch N to choose)")


def _searched(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code, say,
              progress) -> Plan:
    from contextlib import nullcontext

    from trainwise.api.search import plan_search
    from trainwise.common.progress import silent
    from trainwise.emit.train_line import train_flags

    scope = search_scope(request, plan.nproc)
    if scope.line:
        say(scope.line)
    with (progress if progress is not None else nullcontext(silent)) as shown:
        # The search's --nproc is the job's GPUs (a --nproc the user gave is this node's).
        report = plan_search(model, plan.replace(device=device_name, nproc=scope.gpus), request.fixed | {"device"},
                             top=max(1, request.verify), global_batch=scope.global_batch, margin=request.margin,
                             gpus=scope.gpus, gpus_per_node=scope.gpus_per_node, task=task,
                             trust_remote_code=trust_remote_code, progress=shown,
                             installed_only=request.installed_only is not False, rows=request.rows)
    best = report.result.ranked[0]
    if request.verify:
        best = _measured_best(request, report, model, say)
    speed = ("" if math.isnan(best.step_s)
             else f", {best.step_s:.3g} s per step, {best.tokens_per_s:,.0f} tokens/s (job)")
    say(f"--plan auto chose (of {len(report.result.screened)} plans, {report.seconds:.1f} s): predicted "
        f"{human_bytes(best.memory_bytes)} device total{speed}")
    chosen = best.plan.replace(nproc=plan.nproc)  # this node's processes; the layout spans the job's
    say(f"--plan auto trains: {train_flags(chosen, model)}")
    return chosen.replace(device=plan.device)


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
