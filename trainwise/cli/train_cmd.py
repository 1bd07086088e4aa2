"""`trainwise train [MODEL] [knobs] [run settings]`."""

from __future__ import annotations

import os
import sys

from trainwise.cli.output import print_json_line, summary_object
from trainwise.cli.flags import (add_auto_batch_flags, add_installed_only_flag, add_knob_flags, plan_from_args,
                                 typed_values)
from trainwise.cli.verify_args import add_verify_arguments
from trainwise.api import RunConfig
from trainwise.api.train_request import DEFAULT_MODEL


def register(commands) -> None:
    parser = commands.add_parser("train", help="train a model with a plan; live throughput, MFU and memory",
                                 description="Train MODEL (default: tiny-llama on the built-in text corpus) "
                                             "with every knob of the plan applied.")
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help=f"catalog name, local Hugging Face model directory or package.module:function "
                             f"(default: {DEFAULT_MODEL} with --lr 3e-3 --warmup-steps 10 unless given)")
    parser.add_argument("--task", default=None, help="causal-lm, seq-cls, seq2seq or masked-lm")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow a local model directory's own Python code to run (off by default)")
    parser.add_argument("--json", action="store_true",
                        help="print the run's summary as one JSON object, the last line of stdout (the header "
                             "and progress go to stderr)")
    add_knob_flags(parser, RunConfig.specs())
    add_auto_batch_flags(parser)  # --plan auto and --batch-size auto: trainwise/cli/train_auto.py
    add_installed_only_flag(parser)
    add_verify_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    auto, plan, run_config, explicit, checked = _request(args)  # checked before the heavy imports below
    from rich.console import Console

    from trainwise.api.auto_choice import train_stepping_down
    from trainwise.api.launch import continue_after_restart, launch, launches, stop_distributed
    from trainwise.api.train_request import check_before_launch
    from trainwise.api.training import train
    from trainwise.cli.render_train import StepProgress, render_header, render_summary
    from trainwise.cli.train_auto import say

    model = args.model or DEFAULT_MODEL
    if launches(plan, run_config):
        check_before_launch(model, plan, run_config, checked.world, explicit, task=args.task,
                            trust_remote_code=args.trust_remote_code)
        if checked.warning:
            print(checked.warning, file=sys.stderr)
        return launch(args.argv, plan, run_config, auto)
    run_config = continue_after_restart(run_config, say=lambda line: print(line, file=sys.stderr))
    # rank 0 speaks for the job; with --json stdout carries only the summary
    console = Console(quiet=int(os.environ.get("RANK", "0")) != 0, stderr=args.json)
    progress = StepProgress(console, run_config.steps)
    steps = []

    def run_train(chosen):
        return train(model, plan=chosen, run=run_config, task=args.task,
                     trust_remote_code=args.trust_remote_code, device_explicit=explicit,
                     on_ready=lambda r: render_header(r, console), on_step=lambda e: (steps.append(e), progress(e)))
    try:
        with progress:
            result = train_stepping_down(auto, plan, run_train, lambda: len(steps), say)
    finally:
        stop_distributed()
    render_summary(result, console)
    if args.json and not console.quiet:
        print_json_line(summary_object(model, result, run_config))
    return 0


def _request(args):
    """(auto request, Plan, RunConfig, whether --device was given, the checked run: its
    processes on all nodes and restart warning), every setting checked (api/train_request.py);
    `--plan auto` / `--batch-size auto` resolved by a search."""
    from trainwise.api.train_request import auto_device_name, check_run, demo_plan
    from trainwise.cli.train_auto import resolve_auto, take_auto_request
    from trainwise.plan import load_plan_file

    auto = take_auto_request(args)
    plan = plan_from_args(args)
    from_file = load_plan_file(args.plan) if args.plan is not None else {}
    plan = demo_plan(args.model, plan, {*from_file, *typed_values(args, plan.specs())})
    run_config = RunConfig.from_dict(typed_values(args, RunConfig.specs()))
    checked = check_run(run_config, plan)
    # With no --device anywhere, train on what is here (the Plan's default names CUDA).
    explicit = "device" in vars(args) or "device" in from_file
    if auto.plan or auto.batch:  # chosen for the device this run will use
        plan = resolve_auto(auto, plan, args.model or DEFAULT_MODEL,
                            auto_device_name(auto, plan, run_config, explicit), args.task, args.trust_remote_code)
    return auto, plan, run_config, explicit, checked
