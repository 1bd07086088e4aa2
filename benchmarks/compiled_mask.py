"""What a compiled kernel costs when it stores a boolean tensor, next to eager, on this CPU.

    python benchmarks/compiled_mask.py                      # torch's default threads
    OMP_NUM_THREADS=1 python benchmarks/compiled_mask.py    # one thread
    python benchmarks/compiled_mask.py --elements 262144 --rounds 7

An investigation, not a results page. In a training step's compiled regions inductor
writes boolean masks for backward: dropout's (calibrate times a compiled dropout as
training runs it, mask included: trainwise/calibration/compiled_random.py) and, where
autograd would keep an activation only to test its sign, ReLU's (`x <= 0`). This times,
in one process and side by side (the cases taken in turn within every round, so a slow
spell falls on all), the same small functions of one fp32 tensor eager and compiled
(one torch.compile each, static shapes): a product (a float out), a comparison (a
boolean out), both, the comparison stored as uint8, and a dropout's forward without and
with a gradient (the latter writes the mask). Prints the median and range of the rounds'
microseconds per call and compiled / eager."""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=65536, help="elements of the fp32 input")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100, help="calls per round")
    args = parser.parse_args(argv)
    for name in ("elements", "rounds", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be at least 1, got {getattr(args, name)}")
    return args


def cases(torch):
    dropout = torch.nn.functional.dropout
    return {
        "x * 1.1 (float out)": (lambda x: x * 1.1, False),
        "x > 0 (bool out)": (lambda x: x > 0, False),
        "x * 1.1 and x > 0": (lambda x: (x * 1.1, x > 0), False),
        "(x > 0) as uint8": (lambda x: (x > 0).to(torch.uint8), False),
        "dropout, no gradient": (lambda x: dropout(x, 0.1, True), False),
        "dropout, input requires grad": (lambda x: dropout(x, 0.1, True), True),
    }


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    x = torch.randn(args.elements)
    calls = {}
    for name, (function, grad) in cases(torch).items():
        inputs = x.clone().requires_grad_(grad)
        compiled = torch.compile(function)
        for way, run in (("eager", function), ("compiled", compiled)):
            for _ in range(10):  # warm-up, compiling included
                run(inputs)
            calls[(name, way)] = (run, inputs)
    times = {case: [] for case in calls}
    for _ in range(args.rounds):
        for case, (run, inputs) in calls.items():
            started = time.perf_counter()
            for _ in range(args.calls):
                run(inputs)
            times[case].append((time.perf_counter() - started) / args.calls * 1e6)
    print(f"{args.elements} fp32 elements, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {args.rounds} rounds of {args.calls} calls "
          "(measured, us per call, median [min-max]):")
    for name in cases(torch):
        eager, compiled = times[(name, "eager")], times[(name, "compiled")]
        print(f"  {name:30s} eager {statistics.median(eager):8.1f} [{min(eager):.1f}-{max(eager):.1f}]  "
              f"compiled {statistics.median(compiled):8.1f} [{min(compiled):.1f}-{max(compiled):.1f}]  "
              f"compiled / eager {statistics.median(compiled) / statistics.median(eager):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
