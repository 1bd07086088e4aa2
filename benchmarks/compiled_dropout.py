"""What dropout costs a training step eager and with the blocks compiled, on this CPU.

    python benchmarks/compiled_dropout.py                        # tiny-t5, torch's default threads
    OMP_NUM_THREADS=1 python benchmarks/compiled_dropout.py      # one thread
    python benchmarks/compiled_dropout.py --model tiny-bert --rounds 7 --steps 10
    python benchmarks/compiled_dropout.py --model small-gpt2 --profile cpu.json   # predictions beside

An investigation, not a results page: the time model prices a compiled region's dropout
at calibrate's compiled-dropout rate (trainwise/calibration/compiled_random.py), measured
on a lone dropout; this measures it inside real blocks. Four copies of a catalog model
(dropout at the config's rate and at 0, eager and with every block compiled as `--compile`
compiles them: techniques/block_stacks.py), built in this process from the catalog config
(nothing downloaded), batch x sequence of random token ids, AdamW. After warm-up steps
(the compiling ones among them), rounds of --steps steps each, the four taken in turn
within every round so that a slow spell falls on all four; prints the median and range of
the rounds' milliseconds per step, and what dropout adds, eager and compiled. With
--profile (a file `trainwise calibrate` wrote on this machine, same threads), the time
model's prediction of each case is printed beside it: the same config written to a
temporary model directory, estimated with `--compile` for the compiled cases."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import provenance

provenance.add_repo_to_path()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-t5",
                        help="a catalog language model (labels are the token ids), or one of time_model.py's "
                             "config models other than the families it holds out")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", default=None, help="a calibrate profile: print the predicted times beside")
    return parser.parse_args(argv)


DROPOUT_KEYS = ("dropout_rate", "hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
                "attn_pdrop", "dropout", "attention_dropout")


def with_dropout(config: dict, dropout: bool) -> dict:
    """`config` with its dropout rates kept, or every one set to 0 (those the config leaves
    to the model class's defaults too: GPT-2's are 0.1 unless given)."""
    return config if dropout else {**config, **{key: 0.0 for key in DROPOUT_KEYS}}


def dropout_rates(config: dict) -> dict:
    """The dropout rates the model built from `config` uses, defaults included."""
    import transformers

    built = transformers.AutoConfig.for_model(**config)
    return {key: getattr(built, key) for key in DROPOUT_KEYS if getattr(built, key, None)}


def predicted_ms(config: dict, compiled: bool, args) -> float:
    """The time model's step time (ms) of `config` under the measured step's plan."""
    import json
    import tempfile
    from pathlib import Path

    from trainwise.api.estimate import estimate
    from trainwise.plan.plan import Plan

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "config.json").write_text(json.dumps(config))
        plan = Plan(device="cpu", batch_size=args.batch_size, seq_len=args.seq_len, compile=compiled)
        return estimate(directory, plan, profile=args.profile).time.step_s * 1e3


def make_step(config: dict, dropout: bool, compiled: bool, args):
    """A training step of the model built from `config` (its dropout rates kept or set to 0)."""
    import torch
    import transformers

    from trainwise.techniques.block_stacks import stacked_blocks

    config = with_dropout(config, dropout)
    torch.manual_seed(0)
    model_config = transformers.AutoConfig.for_model(**config)
    model_class = getattr(transformers, config["architectures"][0])
    model = model_class(model_config).train()
    if compiled:
        for block in stacked_blocks(model):
            block.compile()
    ids = torch.randint(0, model_config.vocab_size, (args.batch_size, args.seq_len))
    optimizer = torch.optim.AdamW(model.parameters())

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(args.warmup):
        step()
    return step


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from trainwise.models.catalog import find_record, unknown_model_error

    from time_model import CONFIG_MODELS, UNSEEN_FAMILIES

    if args.model in UNSEEN_FAMILIES:
        # Studying them would spoil the time-model page's families not looked at.
        print(f"compiled_dropout.py: error: --model {args.model} is held out (time_model.py's UNSEEN_FAMILIES)",
              file=sys.stderr)
        return 2
    record = find_record(args.model)
    if record is None and args.model not in CONFIG_MODELS:
        print(f"compiled_dropout.py: error: {unknown_model_error(args.model)}", file=sys.stderr)
        return 2
    config = dict(record.hf_config if record is not None else CONFIG_MODELS[args.model])
    if not dropout_rates(config):
        print(f"compiled_dropout.py: note: --model {args.model} has no dropout in its config; "
              "the dropout on and off cases are the same model", file=sys.stderr)
    cases = {(dropout, compiled): make_step(config, dropout, compiled, args)
             for dropout in (True, False) for compiled in (False, True)}
    times = {case: [] for case in cases}
    predicted = ({case: predicted_ms(with_dropout(config, case[0]), case[1], args) for case in cases}
                 if args.profile else {})
    for _ in range(args.rounds):
        for case, step in cases.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[case].append((time.perf_counter() - started) / args.steps * 1e3)
    print(f"{args.model}, {args.batch_size} x {args.seq_len} tokens, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds of {args.steps} steps (measured, ms per step, median [min-max]):")
    for (dropout, compiled), found in times.items():
        beside = (f"; predicted {predicted[(dropout, compiled)]:.1f} "
                  f"({predicted[(dropout, compiled)] / statistics.median(found) - 1:+.0%})" if predicted else "")
        print(f"  dropout {'on ' if dropout else 'off'} {'compiled' if compiled else 'eager   '}: "
              f"{statistics.median(found):.1f} [{min(found):.1f}-{max(found):.1f}]{beside}")
    for compiled in (False, True):
        added = statistics.median(times[(True, compiled)]) - statistics.median(times[(False, compiled)])
        beside = (f" (predicted {predicted[(True, compiled)] - predicted[(False, compiled)]:.1f})"
                  if predicted else "")
        print(f"  dropout adds {added:.1f} ms per step {'compiled' if compiled else 'eager'}{beside}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
