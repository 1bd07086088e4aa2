"""A stand-in for `trainwise train` in bench tests: the same command line, exit codes and
metrics summary, but no training, so a ladder of rows runs in a second.

What it does is chosen by the plan's batch size, so one ladder can mix outcomes:
3 crashes (exit 1 with a traceback), 5 runs out of memory (exit 3), 7 is refused as
something this device cannot do (exit 2), 9 is refused as a bad knob value (exit 2);
anything else finishes and writes a summary. Every run appends its process id to the
file named by $BENCH_STAND_IN_PIDS, if set."""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("model")
for flag in ("--plan", "--data", "--metrics", "--task", "--steps", "--timing-warmup", "--seed"):
    parser.add_argument(flag)
args = parser.parse_args()
plan = json.loads(open(args.plan).read())
if os.environ.get("BENCH_STAND_IN_PIDS"):
    with open(os.environ["BENCH_STAND_IN_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\n")

batch_size = plan["batch_size"]
if batch_size == 3:
    raise RuntimeError("boom in the child")
if batch_size == 5:
    print("trainwise: error: out of memory at step 1: 30.00 GiB needed", file=sys.stderr)
    sys.exit(3)
if batch_size == 7:
    print("trainwise: error: --precision: bf16 needs an Ampere or newer GPU", file=sys.stderr)
    sys.exit(2)
if batch_size == 9:
    print("trainwise: error: --lora-targets: no module named q_proj", file=sys.stderr)
    sys.exit(2)
samples = batch_size * plan["grad_accum"]
summary = {"time_s": 2.0, "samples_per_s": 10.0 * samples, "tokens_per_s": 10.0 * samples * plan["seq_len"],
           "mfu": None, "peak_allocated": 1000 * samples, "peak_reserved": None, "device_total": None,
           "final_loss": 1.0, "memory_method": "stand-in"}
with open(args.metrics, "w") as metrics:
    metrics.write(json.dumps({"step": 1, "loss": 1.0}) + "\n" + json.dumps({"summary": summary}) + "\n")
