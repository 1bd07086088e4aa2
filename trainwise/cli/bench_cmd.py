"""`trainwise bench [MODEL] [--ladder NAME|FILE] [--steps N] [--out DIR] [--json] [knobs]`."""

from __future__ import annotations

from trainwise.cli.flags import add_knob_flags, typed_values


def register(commands) -> None:
    parser = commands.add_parser("bench", help="run a ladder of techniques, each in a fresh process; "
                                               "measured vs predicted, trainwise vs the HF Trainer",
                                 description="Run each rung of a ladder in its own process with trainwise "
                                             "and with the Hugging Face Trainer, and report time, throughput "
                                             "and memory (measured) beside the estimate (predicted).")
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help="catalog name or local model directory (default: bert-large-uncased seq 512 "
                             "sequence classification on a GPU, tiny-llama seq 128 on a CPU)")
    parser.add_argument("--ladder", default=None, help="default, quick, or a YAML file listing {name, plan} "
                                                       "entries (default: default on a GPU, quick on a CPU)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per row; the first is "
                                                              "warm-up, left out of the rates (default: 10)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per row, each a fresh process; the table shows the median and spread "
                             "(default: 3 on a GPU; 1 on a CPU, where the spread is over the run's timed steps)")
    parser.add_argument("--out", default="bench-results",
                        help="directory for results.json, results.csv, results.md and chart.png "
                             "(default: bench-results)")
    parser.add_argument("--baseline", default="hf-trainer", choices=("hf-trainer", "none"),
                        help="also run every row with the Hugging Face Trainer (default: hf-trainer)")
    parser.add_argument("--resume", action="store_true", help="keep the rows already finished in --out")
    parser.add_argument("--task", default=None, help="causal-lm, seq-cls, seq2seq or masked-lm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON (progress goes to stderr)")
    add_knob_flags(parser)
    parser.description += " Knob flags and --plan set the base of every rung; a rung's own knobs win."
    parser.set_defaults(run=run)


def run(args) -> int:
    from rich.console import Console

    from trainwise.api.benchmark import bench
    from trainwise.cli.output import print_json
    from trainwise.cli.progress_bar import progress_bar
    from trainwise.cli.render_bench import render_bench, render_row
    from trainwise.plan import Plan, load_plan_file

    knobs = {**(load_plan_file(args.plan) if args.plan else {}), **typed_values(args, Plan.specs())}
    device = knobs.pop("device", None)
    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 132)  # a log file has room for the whole table
    with progress_bar() as progress:
        rows = bench(args.model, args.ladder, steps=args.steps, out=args.out, baseline=args.baseline,
                     resume=args.resume, device=device, task=args.task, seed=args.seed, base_knobs=knobs,
                     on_row=lambda row: render_row(row, console), repeat=args.repeat, progress=progress)
    if args.json:
        print_json(rows)
    else:
        render_bench(rows, console, args.out)
    return 0
