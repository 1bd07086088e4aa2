"""How fast this machine runs now against when a CPU profile was calibrated: the two
reference training steps `trainwise calibrate` timed (tiny-llama at 1 x 8 and 8 x 256
tokens, trainwise.calibration.host_time), timed again the same way in this process.

    python benchmarks/reference_steps.py --profile cpu.json   # prints the steps and the ratio as JSON

A shared or virtual machine's speed comes and goes: the calibration rows'
measured/predicted on four successive time-model pages of this project's 2-core VM read
1.26, 1.03, 0.87 and 1.26, each from a fresh calibration. A profile taken in a fast minute
predicts every later step short by one common factor. The
time-model benchmark runs this between its rounds of runs, so that its page can tell the
machine's drift from the model's error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()


def calibrated_steps(measured: dict) -> dict[str, float]:
    """{"BxT": seconds} of the reference steps a profile's calibration timed; {} when it
    timed none (a GPU's or a catalog profile)."""
    steps = (measured.get("training_step") or {}).get("steps") or []
    return {f"{p['batch_size']}x{p['seq_len']}": p["step_s"] for p in steps if p.get("step_s")}


def time_now(sizes: list[str], quick: bool) -> dict[str, float]:
    """{"BxT": median seconds of one step} of each reference step, timed as calibrate times it."""
    import torch

    from trainwise.calibration.host_time import steps_timed, time_training_steps
    from trainwise.calibration.timing import FULL, QUICK
    from trainwise.plan.plan import Plan

    found = {}
    for size in sizes:
        batch_size, seq_len = (int(n) for n in size.split("x"))
        steps = steps_timed(QUICK if quick else FULL, (batch_size, seq_len))
        found[size] = time_training_steps(torch.device("cpu"), Plan(batch_size=batch_size, seq_len=seq_len,
                                                                    device="cpu"), steps)[0]
    return found


def ratio(now: dict[str, float], calibrated: dict[str, float]) -> float | None:
    """The machine's slowdown since calibration: the geometric mean over the reference
    steps of seconds now / seconds then (> 1: slower now)."""
    pairs = [now[size] / calibrated[size] for size in now if calibrated.get(size)]
    return statistics.geometric_mean(pairs) if pairs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, required=True, help="a CPU profile written by `trainwise calibrate`")
    args = parser.parse_args(argv)
    try:
        measured = json.loads(args.profile.read_text()).get("measured") or {}
    except (OSError, ValueError) as error:
        parser.error(f"--profile: cannot read {args.profile}: {error}")
    calibrated = calibrated_steps(measured)
    if not calibrated:
        parser.error(f"--profile: {args.profile} has no reference training steps (a CPU profile from "
                     "`trainwise calibrate` has them)")
    now = time_now(sorted(calibrated), bool(measured.get("quick")))  # as many steps as the calibration timed
    print(json.dumps({"now_s": now, "calibrated_s": calibrated, "ratio": ratio(now, calibrated)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
