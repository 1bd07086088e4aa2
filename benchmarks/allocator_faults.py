"""A CPU training step with glibc's default allocator and with freed memory kept, side by side.

    python benchmarks/allocator_faults.py                        # tiny-llama 8 x 256 and gpt2 4 x 128
    python benchmarks/allocator_faults.py --cases tiny-llama:8x256 --rounds 7 --json

An investigation, not a results page. trainwise's CPU runs and calibrations tell glibc to
keep the memory a step frees (trainwise/hardware/allocator.py); by default it unmaps large
buffers and trims its heap, and each step faults the same memory in afresh. For each case
this times, in fresh processes taken in turn (default, kept, default, kept, ...; torch's
default threads), blocks of training steps as trainwise's step runs them
(trainwise.calibration.host_time.reference_step, the case's model from the catalog) and
counts the minor page faults a step takes (getrusage). Prints per case the median
milliseconds per step, the spread of the blocks within a process and across processes
((max - min) / median), the faults per step, and default / kept for each neighbouring pair
of processes."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import provenance

provenance.add_repo_to_path()

MODES = ("default", "kept")
DEFAULT_CASES = ("tiny-llama:8x256", "gpt2:4x128")
BLOCK_S = 0.3  # seconds of steps per timed block, at least one step


def parse_case(text: str) -> tuple[str, int, int]:
    model, _, size = text.partition(":")
    batch, _, seq = size.partition("x")
    if not (model and batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
        raise ValueError(text)
    return model, int(batch), int(seq)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), metavar="MODEL:BxT",
                        help="catalog model and batch x tokens of each case")
    parser.add_argument("--rounds", type=int, default=4, help="fresh processes of each mode per case")
    parser.add_argument("--blocks", type=int, default=8, help="timed blocks of steps in each process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for text in args.cases:
        try:
            parse_case(text)
        except ValueError:
            parser.error(f"--cases: {text!r} is not MODEL:BxT (e.g. tiny-llama:8x256)")
    for name in ("rounds", "blocks"):
        if getattr(args, name) < 1 + (name == "blocks"):
            parser.error(f"--{name}: must be at least {1 + (name == 'blocks')}, got {getattr(args, name)}")
    return args


def child(mode: str, case: str, blocks: int) -> dict:
    """Run in a fresh process: the case's steps timed in blocks under `mode`."""
    from trainwise.hardware.allocator import allocator_in_force, keep_freed_memory

    setting = keep_freed_memory() if mode == "kept" else allocator_in_force()
    import torch

    from trainwise.calibration.host_time import reference_step
    from trainwise.plan.plan import Plan

    model, batch, seq = parse_case(case)
    step = reference_step(torch.device("cpu"), Plan(batch_size=batch, seq_len=seq, device="cpu"), model)
    for _ in range(3):
        step()  # warm-up: optimizer state, first-call costs
    started = time.perf_counter()
    step()
    steps = max(1, round(BLOCK_S / (time.perf_counter() - started)))
    seconds, faults = [], []
    for _ in range(blocks):
        before, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        for _ in range(steps):
            step()
        seconds.append((time.perf_counter() - started) / steps)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps)
    return {"mode": mode, "allocator": setting if mode == "kept" else "glibc default (not changed)",
            "threads": torch.get_num_threads(), "steps_per_block": steps, "block_s": seconds,
            "faults_per_step": statistics.median(faults)}


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def run_case(case: str, rounds: int, blocks: int) -> dict:
    runs = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", mode, "--cases", case,
                                  "--blocks", str(blocks)], capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    found = {"case": case, "modes": {}}
    for mode, done in runs.items():
        medians = [statistics.median(r["block_s"]) for r in done]
        found["modes"][mode] = {"allocator": done[0]["allocator"], "threads": done[0]["threads"],
                                "median_ms": 1e3 * statistics.median(medians),
                                "process_medians_ms": [1e3 * m for m in medians],
                                "spread_within": statistics.median(spread(r["block_s"]) for r in done),
                                "spread_across": spread(medians),
                                "faults_per_step": statistics.median(r["faults_per_step"] for r in done)}
    found["default_over_kept_pairs"] = [d / k for d, k in zip(found["modes"]["default"]["process_medians_ms"],
                                                              found["modes"]["kept"]["process_medians_ms"])]
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.cases[0], args.blocks)))
        return 0
    results = [run_case(case, args.rounds, args.blocks) for case in args.cases]
    if args.json:
        print(json.dumps(results))
        return 0
    for found in results:
        print(f"{found['case']}  ({args.rounds} fresh processes per mode, {args.blocks} blocks each, "
              f"{found['modes']['kept']['threads']} threads)")
        for mode, m in found["modes"].items():
            print(f"  {mode:>7}: {m['median_ms']:8.1f} ms/step; blocks spread {100 * m['spread_within']:.0f} % "
                  f"(median process), processes spread {100 * m['spread_across']:.0f} %; "
                  f"{m['faults_per_step']:,.0f} page faults/step  [{m['allocator']}]")
        pairs = found["default_over_kept_pairs"]
        print(f"  default / kept, neighbouring processes: " + ", ".join(f"{p:.2f}" for p in pairs)
              + f" (median {statistics.median(pairs):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
