"""`trainwise train --plan auto` and `--batch-size auto` on the command line: read the flags
into an `AutoRequest` and print what `api/auto_choice.py` decides (the choice, the pinned
worker command line and the out-of-memory step-down are decided there)."""

from __future__ import annotations

import sys

from trainwise.cli.flags import explicit_knobs, number_option, take_auto_batch
from trainwise.common.errors import InputError
from trainwise.plan.auto_request import AutoRequest
from trainwise.plan.plan import Plan


def say(line: str) -> None:
    """What auto chose goes to stderr: stdout stays the command's own output (--json)."""
    print(line, file=sys.stderr)


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
                       run_verify=_verify_runner(args) if verify else None,
                       installed_only=getattr(args, "installed_only", None))


def _verify_runner(args):
    """--verify K under --plan auto: the same runs and table as `plan --verify`."""
    def run_verify(model, ranked, device):
        from trainwise.cli.verify_args import run_verify_from_args

        return run_verify_from_args(args, model, ranked, device, getattr(args, "profile", None))
    return run_verify


def resolve_auto(request: AutoRequest, plan: Plan, model: str, device_name: str, task, trust_remote_code) -> Plan:
    """The plan to train (api/auto_choice.py decides), the search's progress drawn here."""
    from trainwise.api.auto_choice import resolve_auto as decide
    from trainwise.cli.progress_bar import progress_bar

    return decide(request, plan, model, device_name, task, trust_remote_code, say=say,
                         progress=progress_bar(lines=True) if request.plan else None)


