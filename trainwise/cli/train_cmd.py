"""`trainwise train [MODEL] [knobs] [run settings]`."""

from __future__ import annotations

import os
import sys

from trainwise.cli.output import print_json_line, summary_object
from trainwise.cli.flags import (add_auto_batch_flags, add_installed_only_flag, add_knob_flags, plan_from_args,
                                 typed_values)
from trainwise.cli.verify_args import add_verify_arguments
from trainwise.engine.data.source_check import check_data_source
from trainwise.engine.reports import check_reports
from trainwise.engine.run_config import RunConfig

DEFAULT_MODEL = "tiny-llama"
# With no MODEL, the demo run: a small model on the built-in corpus, with a learning rate
# at which its loss falls visibly within the default 100 steps (flags still override).
DEMO_KNOBS = {"lr": 3e-3, "warmup_steps": 10}


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
    auto, plan, run_config, explicit, warning, world = _request(args)  # checked before the heavy imports below
    from rich.console import Console

    from trainwise.api.training import train
    from trainwise.cli.render_train import StepProgress, render_header, render_summary
    from trainwise.api.auto_choice import train_stepping_down
    from trainwise.cli.train_auto import say
    from trainwise.engine.parallel.launch import should_launch
    from trainwise.engine.parallel.mesh import stop_distributed

    if should_launch(plan.nproc, run_config):
        return _launch(args, auto, plan, run_config, world, explicit, warning)
    run_config = _continue_after_restart(run_config)
    # rank 0 speaks for the job; with --json stdout carries only the summary
    console = Console(quiet=int(os.environ.get("RANK", "0")) != 0, stderr=args.json)
    progress = StepProgress(console, run_config.steps)
    steps = []

    def run_train(chosen):
        return train(args.model or DEFAULT_MODEL, plan=chosen, run=run_config, task=args.task,
                     trust_remote_code=args.trust_remote_code, device_explicit=explicit,
                     on_ready=lambda r: render_header(r, console), on_step=lambda e: (steps.append(e), progress(e)))
    try:
        with progress:
            result = train_stepping_down(auto, plan, run_train, lambda: len(steps), say)
    finally:
        stop_distributed()
    render_summary(result, console)
    if args.json and not console.quiet:
        print_json_line(summary_object(args.model or DEFAULT_MODEL, result, run_config))
    return 0


def _request(args):
    """(auto request, Plan, RunConfig, whether --device was given, a restart warning or
    None, the job's processes on all nodes), every setting checked; `--plan auto` /
    `--batch-size auto` resolved by a search."""
    from trainwise.cli.train_auto import resolve_auto, take_auto_request
    from trainwise.plan import load_plan_file

    auto = take_auto_request(args)
    plan = plan_from_args(args)
    from_file = load_plan_file(args.plan) if args.plan is not None else {}
    if args.model is None:
        chosen = {**from_file, **typed_values(args, plan.specs())}
        plan = plan.replace(**{k: v for k, v in DEMO_KNOBS.items() if k not in chosen})
    run_config = RunConfig.from_dict(typed_values(args, RunConfig.specs()))
    check_reports(run_config)
    check_data_source(run_config)  # before the heavy imports and any search
    from trainwise.engine.parallel.nodes import check_nodes
    from trainwise.engine.runtime import runtime_device

    world = check_nodes(run_config, plan)  # processes on all nodes (--nnodes x --nproc)
    warning = _check_run_settings(run_config, world)
    # With no --device anywhere, train on what is here (the Plan's default names CUDA).
    explicit = "device" in vars(args) or "device" in from_file
    if auto.plan or auto.batch:  # chosen for the device this run will use
        from trainwise.engine.data.chat import chat_tokenizer
        from trainwise.engine.job import device_name_for_estimate

        if run_config.chat:  # its chat template, before seconds of search
            chat_tokenizer(run_config.tokenizer)
        if auto.plan:
            from trainwise.api.auto_choice import data_rows

            auto.nnodes = run_config.nnodes
            auto.rows = data_rows(run_config, plan.seq_len)

        plan = resolve_auto(auto, plan, args.model or DEFAULT_MODEL,
                            device_name_for_estimate(runtime_device(plan.device, explicit=explicit)),
                            args.task, args.trust_remote_code)
    return auto, plan, run_config, explicit, warning, world


def _check_run_settings(run_config: RunConfig, world: int) -> str | None:
    """Refuse run settings that cannot work, before any process starts; the restart warning, if
    any. `world`: the job's processes on all nodes."""
    from trainwise.engine.checkpoint_saves import check_async_request
    from trainwise.engine.parallel.mesh import under_torchrun
    from trainwise.engine.parallel.restarts import check_restart_request

    check_async_request(run_config, world > 1 or under_torchrun())
    return check_restart_request(run_config, world)


def _launch(args, auto, plan, run_config, world: int, explicit, warning) -> int:
    """Start torchrun for this node's processes, after the checks that can fail before any
    worker starts: bad input fails here, once, with exit 2. Under --nnodes every node runs
    them, each for the whole job of `world` processes, and each checks the --out its ranks
    will write their checkpoint shards to (storage shared by the nodes)."""
    from trainwise.api.training import check_train_request
    from trainwise.api.auto_choice import pinned_argv
    from trainwise.engine.output_preflight import check_training_output, count_parameters_of
    from trainwise.engine.parallel.launch import launch_local
    from trainwise.engine.runtime import runtime_device
    from trainwise.models import resolve_model
    from trainwise.models.families.checks import check_model_layout
    from trainwise.plan.layout import resolve_layout

    layout = resolve_layout(plan, world)
    spec = resolve_model(args.model or DEFAULT_MODEL, task=args.task, trust_remote_code=args.trust_remote_code)
    check_train_request(plan, runtime_device(plan.device, explicit=explicit), spec, world)
    check_model_layout(spec.config, plan, layout)
    check_training_output(run_config.output, plan, run_config, count_parameters_of(spec))
    if warning:
        print(warning, file=sys.stderr)
    argv = pinned_argv(args.argv, plan, auto) if auto.plan or auto.batch else args.argv
    return launch_local(plan.nproc, argv, run_config)


def _continue_after_restart(run_config: RunConfig) -> RunConfig:
    """A worker restarted by torchrun continues from this job's newest checkpoint. The
    `trainwise train --nproc` launcher announces each restart; under a torchrun started by
    hand, rank 0 does."""
    from trainwise.engine.parallel.restarts import (MAX_RESTARTS, launched_by_trainwise, restart_attempt,
                                                    restart_line, run_for_this_attempt)

    continued, checkpoint = run_for_this_attempt(run_config)
    if restart_attempt() and not launched_by_trainwise() and os.environ.get("RANK", "0") == "0":
        print(restart_line(restart_attempt(), int(os.environ.get(MAX_RESTARTS, "0") or 0), checkpoint, None),
              file=sys.stderr)
    return continued
