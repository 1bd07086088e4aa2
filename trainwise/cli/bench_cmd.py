"""`trainwise bench [MODEL] [--ladder NAME|FILE] [--steps N] [--out DIR] [--json]`."""

from __future__ import annotations


def register(commands) -> None:
    parser = commands.add_parser("bench", help="run a ladder of techniques, each in a fresh process; "
                                               "measured vs predicted, trainwise vs the HF Trainer",
                                 description="Run each rung of a ladder in its own process with trainwise "
                                             "and with the Hugging Face Trainer, and report time, throughput "
                                             "and memory (measured) beside the estimate (predicted).")
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help="catalog name or local model directory (default: bert-large-uncased seq 512 on "
                             "a GPU, tiny-llama seq 128 on a CPU)")
    parser.add_argument("--ladder", default=None, help="default, quick, or a YAML file of {name, plan} entries "
                                                       "(default: default on a GPU, quick on a CPU)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per row (first one is warm-up)")
    parser.add_argument("--out", default="bench-results", help="directory for results.json/.csv and chart.png")
    parser.add_argument("--baseline", default="hf-trainer", help="hf-trainer (default) or none")
    parser.add_argument("--resume", action="store_true", help="skip rows already finished in --out")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--task", default=None, help="causal-lm, seq-cls, seq2seq or masked-lm")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample for every row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.set_defaults(run=run)


def run(args) -> int:
    import torch
    from rich.console import Console

    from trainwise.api.benchmark import bench
    from trainwise.cli.main import print_json
    from trainwise.cli.render_bench import render_bench, render_row

    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = max(console.width, 132)  # a log file has room for the whole table
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu"
    ladder = args.ladder or ("default" if on_gpu else "quick")
    knobs = {"seq_len": args.seq_len} if args.seq_len else {}
    rows = bench(args.model, ladder, steps=args.steps, out=args.out, baseline=args.baseline, resume=args.resume,
                 device=args.device, task=args.task, seed=args.seed, base_knobs=knobs,
                 on_row=lambda row: render_row(row, console))
    if args.json:
        print_json(rows)
    else:
        render_bench(rows, console, args.out)
    return 0
