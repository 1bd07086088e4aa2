"""What dropout costs a training step eager and with the blocks compiled, on this CPU.

    python benchmarks/compiled_dropout.py                        # tiny-t5, torch's default threads
    OMP_NUM_THREADS=1 python benchmarks/compiled_dropout.py      # one thread
    python benchmarks/compiled_dropout.py --model tiny-bert --rounds 7 --steps 10

An investigation, not a results page: the time model prices a compiled region's dropout
at calibrate's compiled-dropout rate (trainwise/calibration/compiled_random.py), measured
on a lone dropout; this measures it inside real blocks. Four copies of a catalog model
(dropout at the config's rate and at 0, eager and with every block compiled as `--compile`
compiles them: techniques/block_stacks.py), built in this process from the catalog config
(nothing downloaded), batch x sequence of random token ids, AdamW. After warm-up steps
(the compiling ones among them), rounds of --steps steps each, the four taken in turn
within every round so that a slow spell falls on all four; prints the median and range of
the rounds' milliseconds per step, and what dropout adds, eager and compiled."""

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
                        help="a catalog language model (labels are the token ids) with a dropout rate in its config")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args(argv)


DROPOUT_KEYS = ("dropout_rate", "hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
                "attn_pdrop", "dropout", "attention_dropout")


def make_step(config: dict, dropout: bool, compiled: bool, args):
    """A training step of the model built from `config` (its dropout rates kept or set to 0)."""
    import torch
    import transformers

    from trainwise.techniques.block_stacks import stacked_blocks

    config = {k: (v if dropout or k not in DROPOUT_KEYS else 0.0) for k, v in config.items()}
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

    record = find_record(args.model)
    if record is None:
        print(f"compiled_dropout.py: error: {unknown_model_error(args.model)}", file=sys.stderr)
        return 2
    config = dict(record.hf_config)
    if not any(config.get(k) for k in DROPOUT_KEYS):
        print(f"compiled_dropout.py: error: --model {args.model} has no dropout in its config", file=sys.stderr)
        return 2
    cases = {(dropout, compiled): make_step(config, dropout, compiled, args)
             for dropout in (True, False) for compiled in (False, True)}
    times = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, step in cases.items():
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[case].append((time.perf_counter() - started) / args.steps * 1e3)
    print(f"{args.model}, {args.batch_size} x {args.seq_len} tokens, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds of {args.steps} steps (measured, ms per step, median [min-max]):")
    for (dropout, compiled), found in times.items():
        print(f"  dropout {'on ' if dropout else 'off'} {'compiled' if compiled else 'eager   '}: "
              f"{statistics.median(found):.1f} [{min(found):.1f}-{max(found):.1f}]")
    for compiled in (False, True):
        added = statistics.median(times[(True, compiled)]) - statistics.median(times[(False, compiled)])
        print(f"  dropout adds {added:.1f} ms per step {'compiled' if compiled else 'eager'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
