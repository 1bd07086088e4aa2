"""How the CPU step-time model's error moves with the micro-batch's size, the machine's
common drift taken out: one profile, every size timed at the same moment.

    python benchmarks/step_sizes.py --profile cpu.json                # tiny-llama, 2 rounds
    python benchmarks/step_sizes.py --profile cpu.json --model tiny-gpt2 --sizes 1x64,4x64,16x64 --rounds 3 --json

An investigation, not a results page. The time-model page (time_model.py) compares plans
run minutes apart in fresh processes with a profile taken minutes before them, and on this
project's 2-core VM the machine's speed moves by more than the model's error over such
spans, so that page cannot tell a size the model misprices from a minute the machine ran
slow. Here the reference model's training step (trainwise.calibration.host_time:
reference_step, the loop `trainwise train` runs) is built once per size in this process
and timed in interleaved blocks, a block of each size in turn (InterleavedSteps), so every
size meets the same speed; beside each, `trainwise.api.estimate(model, plan,
profile=...).time.step_s`. The error a profile from a faster or slower minute puts on
every size alike is one factor: each round's sizes are also shown against the round's
median measured/predicted ("shape"), which is what the model gets wrong about one size
against another, the part a planner choosing between micro-batch sizes depends on. A
shape that holds from round to round and run to run is the model's; one that moves is
the machine's.

Prints a provenance line, then per round a table (size, predicted ms, measured ms, error,
shape error, the blocks' spread); `--json` prints the same as one JSON object."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()

DEFAULT_SIZES = "1x8,1x64,2x64,4x64,8x64,16x64,4x128,8x256"
BLOCKS = 5  # blocks per size per round, the sizes' blocks in turn


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'BxT,...' -> [(batch, tokens)], each positive; a one-line error naming the flag otherwise."""
    sizes = []
    for part in text.split(","):
        batch, _, tokens = part.strip().partition("x")
        if not (batch.isdigit() and tokens.isdigit() and int(batch) > 0 and int(tokens) > 0):
            raise ValueError(f"--sizes: {part.strip()!r} is not BATCHxTOKENS (e.g. 4x64)")
        sizes.append((int(batch), int(tokens)))
    if len(sizes) < 2:
        raise ValueError("--sizes: give at least two sizes (a shape needs more than one)")
    return sizes


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, required=True, help="a CPU profile written by `trainwise calibrate`")
    parser.add_argument("--model", default="tiny-llama", help="a catalog model (default: calibrate's reference model)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"BATCHxTOKENS,... (default {DEFAULT_SIZES})")
    parser.add_argument("--rounds", type=int, default=2, help="times every size is timed again, all sizes each time")
    parser.add_argument("--seconds", type=float, default=0.1, help="about how long one block of a size runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        args.sizes = parse_sizes(args.sizes)
    except ValueError as error:
        parser.error(str(error))
    if args.rounds < 1:
        parser.error(f"--rounds: must be at least 1, got {args.rounds}")
    if not args.seconds > 0:
        parser.error(f"--seconds: must be more than 0, got {args.seconds}")
    if not args.profile.is_file():
        parser.error(f"--profile: no such file: {args.profile}")
    return args


def shaped(rows: list[dict]) -> list[dict]:
    """`rows` ({"predicted_s", "measured_s", ...} per size, one round) with "error" (predicted
    over measured, less 1) and "shape_error": the same after dividing every prediction by the
    round's median predicted/measured, the factor a profile from a faster or slower minute
    puts on every size alike."""
    common = statistics.median(row["predicted_s"] / row["measured_s"] for row in rows)
    return [{**row, "error": row["predicted_s"] / row["measured_s"] - 1,
             "shape_error": row["predicted_s"] / common / row["measured_s"] - 1} for row in rows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from trainwise.api.estimate import estimate
    from trainwise.calibration.host_time import InterleavedSteps, spread
    from trainwise.hardware.profile import read_profile
    from trainwise.plan.plan import Plan

    prov = provenance.collect(provenance.script_command("step_sizes.py", sys.argv[1:] if argv is None else argv))
    profile = read_profile(args.profile)
    plans = [Plan(batch_size=b, seq_len=t, device="cpu") for b, t in args.sizes]
    predicted = [estimate(args.model, plan, profile=profile).time.step_s for plan in plans]
    # Steps per block: --seconds at the predicted pace, at least one.
    counts = [max(1, round(args.seconds / max(p, 1e-6))) for p in predicted]
    steps = InterleavedSteps(torch.device("cpu"), plans, counts, args.model)
    rounds = []
    for _ in range(args.rounds):
        start = len(steps.taken_at)
        for _ in range(BLOCKS):
            steps.time_block()
        rows = [{"size": f"{b}x{t}", "predicted_s": p, "measured_s": statistics.median(timed[start:]),
                 "spread": spread(timed[start:])}
                for (b, t), p, timed in zip(args.sizes, predicted, steps.blocks)]
        rounds.append(shaped(rows))
    prov = provenance.finish(prov)
    report = {"provenance": {k: v for k, v in prov.items() if k != "cpu_probe"}, "model": args.model,
              "profile": str(args.profile), "threads": torch.get_num_threads(), "rounds": rounds}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{prov['command']}; commit {prov['commit']}; {prov['device']}; {prov['versions']}; "
          f"{torch.get_num_threads()} threads; {provenance.load_line(prov)}")
    for index, rows in enumerate(rounds, 1):
        print(f"round {index} ({args.model}, {BLOCKS} blocks per size, sizes in turn): "
              "size, predicted ms (predicted), measured ms (median, measured), error, shape error, spread")
        for row in rows:
            print(f"  {row['size']:>7}  {row['predicted_s'] * 1e3:8.2f}  {row['measured_s'] * 1e3:8.2f}  "
                  f"{row['error']:+7.1%}  {row['shape_error']:+7.1%}  {row['spread']:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
