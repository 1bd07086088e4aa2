"""Whether this machine's speed moves the same way for a training step, a matmul and an
element-wise op: the question behind calibrating a CPU profile on a VM whose speed moves.

    python benchmarks/speed_drift.py                   # 40 rounds, torch's default threads
    python benchmarks/speed_drift.py --rounds 80 --json

An investigation, not a results page. calibrate fits the factor of a training step's
element-wise work from two reference training steps (tiny-llama at 1 x 8 and 8 x 256
tokens, trainwise.calibration.host_time) and rates measured a minute earlier. On this
project's 2-core VM the 8 x 256 step took 30-42 ms in back-to-back fresh processes, so
a step timed in a slow spell against rates taken in a fast one puts the whole difference
on the element-wise factor. `--allocator default` leaves glibc's malloc as it is, which
faults a step's freed memory in afresh every step (trainwise/hardware/allocator.py). This times, in one process, round after round, a block of
each: the 8 x 256 reference step, the 1 x 8 one, a matmul of the larger step's shape
(tokens x hidden x 3 hidden, fp32) and an element-wise add of 4 Mi fp32 elements, each
block about a tenth of a second, so neighbours in a round share the moment's speed. It
prints each round's seconds, and for each probe: how its round-to-round changes follow the
large step's (Pearson correlation of the log times) and the large step's spread (max -
min over median) before and after dividing each round's step by that probe's time in the
same round (times its median). A probe that tracks the machine's speed shrinks the
spread; one that does not leaves it or widens it."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import provenance

provenance.add_repo_to_path()

BLOCK_S = 0.1  # seconds each probe runs per round


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print the rounds and the summary as JSON")
    parser.add_argument("--allocator", choices=("kept", "default"), default="kept",
                        help="keep freed memory as trainwise's CPU runs do (trainwise/hardware/allocator.py), "
                             "or leave glibc's default")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error(f"--rounds: must be at least 3 (a spread and a correlation need them), got {args.rounds}")
    return args


def probes(torch):
    """{name: a function running it once}, the two reference steps first."""
    from trainwise.calibration.host_time import COMPUTE_BOUND, HOST_BOUND, REFERENCE_MODEL, reference_step
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan

    cpu = torch.device("cpu")
    hidden = resolve_model(REFERENCE_MODEL).config.hidden_size
    tokens = COMPUTE_BOUND[0] * COMPUTE_BOUND[1]
    a, b = torch.randn(tokens, hidden), torch.randn(hidden, 3 * hidden)
    x, y, out = torch.randn(4 << 20), torch.randn(4 << 20), torch.empty(4 << 20)
    return {"step 8x256": reference_step(cpu, Plan(batch_size=COMPUTE_BOUND[0], seq_len=COMPUTE_BOUND[1], device="cpu")),
            "step 1x8": reference_step(cpu, Plan(batch_size=HOST_BOUND[0], seq_len=HOST_BOUND[1], device="cpu")),
            "matmul": lambda: torch.mm(a, b),
            "add": lambda: torch.add(x, y, out=out)}


def calls_per_block(work) -> int:
    for _ in range(3):
        work()  # warm-up
    started = time.perf_counter()
    work()
    return max(1, round(BLOCK_S / max(time.perf_counter() - started, 1e-6)))


def run_rounds(work: dict, rounds: int) -> list[dict]:
    """Seconds per call of each probe, one dict per round, the probes taken in turn."""
    calls = {name: calls_per_block(fn) for name, fn in work.items()}
    found = []
    for _ in range(rounds):
        row = {}
        for name, fn in work.items():
            started = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            row[name] = (time.perf_counter() - started) / calls[name]
        found.append(row)
    return found


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def correlation(xs: list[float], ys: list[float]) -> float | None:
    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxy = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    sxx, syy = sum((a - mx) ** 2 for a in lx), sum((b - my) ** 2 for b in ly)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def summary(rows: list[dict], target: str = "step 8x256") -> dict:
    """For each probe other than `target`: the correlation of its log times with the
    target's, and the target's spread divided by it (each round's target over the probe's
    time that round, times the probe's median)."""
    steps = [row[target] for row in rows]
    out = {"target": target, "target_median_s": statistics.median(steps), "target_spread": spread(steps),
           "probes": {}}
    for name in rows[0]:
        if name == target:
            continue
        times = [row[name] for row in rows]
        middle = statistics.median(times)
        normalised = [s / t * middle for s, t in zip(steps, times)]
        out["probes"][name] = {"median_s": middle, "spread": spread(times),
                               "correlation_with_target": correlation(steps, times),
                               "target_spread_normalised": spread(normalised)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trainwise.hardware.allocator import keep_freed_memory

    allocator = keep_freed_memory() if args.allocator == "kept" else "glibc default (not changed)"
    import torch

    rows = run_rounds(probes(torch), args.rounds)
    found = summary(rows)
    found["threads"], found["rounds"], found["allocator"] = torch.get_num_threads(), args.rounds, allocator
    if args.json:
        print(json.dumps({"rounds": rows, "summary": found}))
        return 0
    names = list(rows[0])
    print("round  " + "  ".join(f"{name:>12}" for name in names) + "   (ms per call)")
    for i, row in enumerate(rows):
        print(f"{i:5d}  " + "  ".join(f"{1e3 * row[name]:12.3f}" for name in names))
    print(f"\n{found['target']}: median {1e3 * found['target_median_s']:.2f} ms, spread "
          f"{100 * found['target_spread']:.0f} % over {args.rounds} rounds at {found['threads']} threads; "
          f"allocator: {allocator}")
    for name, probe in found["probes"].items():
        corr = probe["correlation_with_target"]
        print(f"  {name:>10}: spread {100 * probe['spread']:.0f} %, correlation "
              f"{'n/a' if corr is None else f'{corr:.2f}'}; the step divided by it spreads "
              f"{100 * probe['target_spread_normalised']:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
