"""`trainwise plan MODEL --device GPU [--gpus N] [knobs]`: search every plan, show the best."""

from __future__ import annotations

import sys

from trainwise.cli.flags import (add_auto_batch_flags, add_installed_only_flag, add_knob_flags, explicit_knobs,
                                 number_option, section, take_auto_batch)
from trainwise.cli.flags import check_device_name, plan_from_args
from trainwise.cli.verify_args import add_verify_arguments, verify_count


def register(commands) -> None:
    parser = commands.add_parser("plan", help="search every plan for a model and a machine; rank by predicted speed",
                                 description="Search micro-batch, accumulation, precision, checkpointing, optimizer, "
                                             "attention kernel (and the layouts of several GPUs) for MODEL; keep "
                                             "the plans predicted to fit and rank them by predicted tokens/s. Any "
                                             "plan flag given is held fixed.")
    parser.add_argument("model", metavar="MODEL", help="catalog name, local Hugging Face directory or module:function")
    layout = section(parser, "parallel layout")
    layout.add_argument("--gpus", default="1", metavar="N", help="GPUs in all (default: 1)")
    layout.add_argument("--gpus-per-node", default=None, metavar="G", help="GPUs per node (default: all on one)")
    layout.add_argument("--inter-node-gbps", default=None, metavar="X", help="link between nodes, Gbit/s per GPU")
    parser.add_argument("--top", default="3", metavar="K", help="plans to show (default: 3)")
    parser.add_argument("--allow", default=None, metavar="LIST",
                        help="techniques that change the training math the search may use: "
                             "lora, adamw-8bit, adafactor, bf16-pure, fp16 (comma-separated)")
    parser.add_argument("--profile", default=None, metavar="FILE", help="device profile (from `trainwise calibrate`)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write each shown plan as DIR/plan-N.yaml")
    parser.add_argument("--emit", default=None,
                        choices=("trainer", "accelerate", "deepspeed", "torchrun", "slurm", "torchtitan"),
                        help="print the best plan for another launcher (with --emit-out FILE: write it there)")
    parser.add_argument("--chart", default=None, metavar="FILE",
                        help="also draw every screened plan as predicted memory vs tokens/s, with the capacity, "
                             "the pick and the alternatives, as a PNG")
    parser.add_argument("--emit-out", default=None, metavar="FILE", help="where --emit writes (default: print)")
    _add_run_arguments(parser.add_argument_group("what the printed train lines and --emit train"))
    parser.add_argument("--task", default=None, help="causal-lm, seq-cls, seq2seq or masked-lm")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow a local model directory's own code")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_knob_flags(parser)
    add_auto_batch_flags(parser)
    add_installed_only_flag(parser)
    add_verify_arguments(parser)
    parser.set_defaults(run=run)


def _add_run_arguments(group) -> None:
    """Passed through to the `trainwise train` lines and --emit files, so they train what the
    user means (without them: the model's catalog weights or random init, builtin data)."""
    group.add_argument("--data", default=None, metavar="PATH", help="training data (as train --data)")
    group.add_argument("--tokenizer", default=None, metavar="DIR", help="tokenizer directory (as train --tokenizer)")
    group.add_argument("--steps", default=None, metavar="N", help="optimizer steps (as train --steps)")
    group.add_argument("--train-out", default=None, metavar="DIR",
                       help="checkpoints and the final model of the run (train --out)")
    group.add_argument("--save-every", default=None, metavar="N", help="checkpoint interval (as train --save-every)")
    group.add_argument("--max-restarts", default=None, metavar="N", help="restarts of a failed job (as train)")


def launch_from_args(args):
    """The Launch of `plan`'s arguments: what the train lines carry besides the plan."""
    from trainwise.api.emit import Launch

    return Launch(model=args.model, gpus_per_node=number_option(args, "gpus_per_node"), task=args.task,
                  trust_remote_code=args.trust_remote_code, data=args.data, tokenizer=args.tokenizer,
                  steps=number_option(args, "steps", minimum=1), output=args.train_out,
                  save_every=number_option(args, "save_every", minimum=0),
                  max_restarts=number_option(args, "max_restarts", minimum=0))


def run(args) -> int:
    from trainwise.cli.chart_file import check_chart_path

    chart = check_chart_path(args.chart) if args.chart else None  # refused before any work
    import warnings

    from trainwise.cli.output import print_json
    from trainwise.cli.progress_bar import progress_bar
    from trainwise.cli.render_plan import plan_json, render_plan, write_outputs

    # The estimate runs transformers' checkpointing switch dozens of times; its deprecation
    # notice would drown the table.
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    take_auto_batch(args)  # auto is what the search does with a micro-batch it is not given
    verify = verify_count(args)  # a bad value is refused before the search
    fixed = explicit_knobs(args)
    numbers = dict(global_batch=number_option(args, "global_batch"),
                   gpus=number_option(args, "gpus", minimum=1), top=number_option(args, "top", minimum=1),
                   gpus_per_node=number_option(args, "gpus_per_node"),
                   inter_node_gbps=number_option(args, "inter_node_gbps", float, 0),
                   margin=number_option(args, "memory_margin", float, 0), installed_only=args.installed_only)
    plan = plan_from_args(args)
    check_device_name(plan.device)
    # torch and transformers (seconds of a cold start) only once the flags above are known good.
    from rich.console import Console

    from trainwise.api.emit import check_emit_target, emit_best
    from trainwise.api.search import parse_allow, plan_search

    search_args = dict(allow=parse_allow(args.allow), **numbers)
    launch = launch_from_args(args)  # a bad value is refused before the search
    check_emit_target(args.emit, args.model)  # e.g. a model torchtitan has no flavor of, before the search
    if verify:
        from trainwise.hardware import resolve_device
        from trainwise.api.verify import check_device_present

        check_device_present(resolve_device(plan.device))
        search_args["top"] = max(search_args["top"], verify)
    with progress_bar() as progress:
        report = plan_search(args.model, plan, fixed, profile=args.profile, task=args.task,
                             trust_remote_code=args.trust_remote_code, progress=progress, **search_args)
    paths = write_outputs(report, args.out)
    emitted = emit_best(report, args.emit, launch, args.emit_out)
    if chart:
        from trainwise.cli.plan_chart import draw, plan_chart

        print(f"chart: {draw(plan_chart(report), chart)} (screened plans, predicted)", file=sys.stderr)
    if not args.json:
        render_plan(report, paths, Console(), launch)
    verified = _verify(args, report) if verify else None
    if args.json:
        print_json({**plan_json(report, paths, emitted, launch), **({"verify": verified} if verified else {})})
    else:
        if emitted and args.emit_out is None:
            print(emitted[0])
        for knob in emitted[1] if emitted else []:
            print(f"--emit {args.emit} cannot express: {knob}", file=sys.stderr)
    return 0


def _verify(args, report) -> dict:
    """Run the top --verify K plans here (after the table, so the user sees what runs) and
    return the report's JSON."""
    from pathlib import Path

    from trainwise.cli.verify_args import run_verify_from_args
    from trainwise.api.verify import report_to_json

    profile = Path(args.profile) if args.profile else None
    verified = run_verify_from_args(args, args.model, list(report.result.ranked), report.device, profile)
    return report_to_json(verified)

