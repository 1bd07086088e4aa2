"""`trainwise export CHECKPOINT --out DIR`: a checkpoint as a Hugging Face directory."""

from __future__ import annotations


def register(commands) -> None:
    parser = commands.add_parser("export", help="turn a checkpoint (distributed or not) into a Hugging Face "
                                                "directory that from_pretrained loads")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory, e.g. "
                                                                 "OUTPUT/checkpoints/step-00000100")
    parser.add_argument("--out", required=True, help="directory to write, outside the checkpoint's run (replaced "
                                                      "atomically if trainwise wrote it before; anything else "
                                                      "there is refused)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from trainwise.api.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out)
    print(f"wrote {out} (its tensors read back and checked against the model config.json describes; "
          "from_pretrained loads it)")
    return 0
