"""`trainwise export CHECKPOINT --out DIR`: a checkpoint as a Hugging Face directory."""

from __future__ import annotations

import sys


def register(commands) -> None:
    parser = commands.add_parser("export", help="turn a checkpoint (distributed or not) into a Hugging Face "
                                                "directory that from_pretrained loads")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory, e.g. "
                                                                 "OUTPUT/checkpoints/step-00000100")
    parser.add_argument("--out", required=True, help="directory to write, outside the checkpoint's run (replaced "
                                                      "atomically if trainwise wrote it before; anything else "
                                                      "there is refused)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (out, checkpoint, tokenizer) instead of a sentence")
    parser.set_defaults(run=run)


def run(args) -> int:
    from trainwise.api.export import export_checkpoint, run_tokenizer

    out = export_checkpoint(args.checkpoint, args.out)
    tokenizer = run_tokenizer(args.checkpoint)
    copied = tokenizer is not None and (out / "tokenizer_config.json").is_file()
    if args.json:
        from trainwise.cli.output import print_json

        print_json({"out": str(out), "checkpoint": str(args.checkpoint),
                    "tokenizer": str(tokenizer) if copied else None})
        return 0
    print(f"wrote {out} (its tensors read back and checked against the model config.json describes; "
          "from_pretrained loads it)" + (f"; with the run's tokenizer from {tokenizer}" if copied else ""))
    if tokenizer is not None and not copied:
        print(f"note: the run's tokenizer {tokenizer} is no longer there; the export holds the model only",
              file=sys.stderr)
    return 0
