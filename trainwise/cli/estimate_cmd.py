"""`trainwise estimate MODEL [knobs]`."""

from __future__ import annotations

import sys

from trainwise.cli.flags import (add_auto_batch_flags, add_knob_flags, check_device_name, number_option, plan_from_args,
                                 section)


def register(commands) -> None:
    parser = commands.add_parser("estimate", help="predict the memory and time of one training step (no GPU needed)",
                                 description="Predict the memory anatomy of one training step of MODEL, "
                                             "by tracing the real step on fake tensors.")
    parser.add_argument("model", metavar="MODEL",
                        help="catalog name (see `trainwise models`), a local Hugging Face model directory, "
                             "or package.module:function returning (model, batch)")
    parser.add_argument("--task", default=None, help="causal-lm, seq-cls, seq2seq or masked-lm (default: the model's usual)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow a local model directory's own Python code to run (off by default)")
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="device profile for the step time (written by trainwise calibrate; default: the "
                             "cached calibration of the device, else the catalog's figures for a catalog GPU)")
    layout = section(parser, "parallel layout")
    layout.add_argument("--gpus-per-node", default=None, metavar="G",
                        help="under a layout: GPUs per node, ranks numbered node by node (default: all on one node)")
    layout.add_argument("--inter-node-gbps", default=None, metavar="X",
                        help="under a layout: the link between nodes, Gbit/s per GPU (default: 400)")
    parser.add_argument("--from-training-args", metavar="FILE", action="append", default=None,
                        help="read the plan from a Transformers TrainingArguments JSON (to_json_string()), a DeepSpeed "
                             "config or an accelerate config; repeat for several; flags typed win; every setting mapped "
                             "approximately or ignored is listed")
    parser.add_argument("--no-cache", action="store_true",
                        help="trace the model even when the per-user trace cache holds this request's estimate "
                             "(same catalog model, plan, device and versions), and keep nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--by-module", action="store_true", help="also show which modules hold the activations")
    parser.add_argument("--chart", metavar="FILE", default=None,
                        help="also draw the memory anatomy (per pipeline rank under a layout) against the device's "
                             "capacity as a PNG")
    add_knob_flags(parser)
    add_auto_batch_flags(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    from trainwise.cli.chart_file import check_chart_path
    from trainwise.cli.train_auto import resolve_auto, take_auto_request

    chart = check_chart_path(args.chart) if args.chart else None  # refused before any work
    per_node = number_option(args, "gpus_per_node")
    inter_node = number_option(args, "inter_node_gbps", float, 0)
    auto = take_auto_request(args)
    if auto.plan:
        from trainwise.common.errors import InputError
        raise InputError("--plan", "auto is for `trainwise train`; to search plans use `trainwise plan`")
    foreign = read_foreign(args)
    plan = plan_from_args(args, foreign.values if foreign else None)
    check_device_name(plan.device)
    per_node = per_node or (foreign.gpus_per_node if foreign else None)
    # torch and transformers (seconds of a cold start) only once the flags are known good.
    from trainwise.api import estimate
    from trainwise.cli.output import FROM_CACHE, print_json

    plan = resolve_auto(auto, plan, args.model, plan.device, args.task, args.trust_remote_code)
    result = estimate(args.model, plan, task=args.task, trust_remote_code=args.trust_remote_code,
                      profile=args.profile, gpus_per_node=per_node, inter_node_gbps=inter_node,
                      cache=not args.no_cache)
    if args.json:
        data = result.to_json()
        if args.by_module:
            data["activations_by_module"] = result.activations_by_module
        if foreign:
            data["from_training_args"] = foreign.to_json()
        print_json(data)
        if result.from_cache:  # the JSON is the traced estimate's, word for word
            print(FROM_CACHE, file=sys.stderr)
    else:
        # The table's modules (rich) only for a table: --json needs none of them.
        from rich.console import Console

        from trainwise.cli.render_estimate import render_estimate
        from trainwise.cli.render_foreign import render_foreign

        console = Console()
        if foreign:
            render_foreign(foreign, console)
        render_estimate(result, console, by_module=args.by_module)
    if chart:
        from trainwise.cli.estimate_chart import anatomy_chart, draw

        print(f"chart: {draw(anatomy_chart(result), chart)} (memory anatomy, predicted)", file=sys.stderr)
    return 0


def read_foreign(args):
    """The knobs of the --from-training-args files (None without the flag); read before any
    model is built, so a setting with no equivalent stops the command at once."""
    if not args.from_training_args:
        return None
    from trainwise.cli.flags import typed_values
    from trainwise.plan import Plan
    from trainwise.plan.foreign_config import read_foreign_configs

    return read_foreign_configs(args.from_training_args, typed_values(args, Plan.specs()))
