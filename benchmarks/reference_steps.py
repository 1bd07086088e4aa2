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
import sys
from pathlib import Path

import provenance

provenance.add_repo_to_path()


def calibrated_steps(measured: dict) -> dict[str, float]:
    """{"BxT": seconds} of the reference steps a profile's calibration timed; {} when it
    timed none (a GPU's or a catalog profile)."""
    return {f"{p['batch_size']}x{p['seq_len']}": p["step_s"] for p in _fitted(measured)}


def _fitted(measured: dict) -> list[dict]:
    steps = (measured.get("training_step") or {}).get("steps") or []
    return [p for p in steps if p.get("step_s")]


def time_now(measured: dict) -> dict:
    """{"now_s", "calibrated_s" ({"BxT": median seconds of one step}), "ratio" (the geometric
    mean over the steps of now / at calibration: > 1 slower now)}: the profile's reference
    steps timed as calibrate times them (trainwise.calibration.steadiness, which calibrate
    itself runs at its end), as many steps as the calibration timed."""
    import torch

    from trainwise.calibration.steadiness import retimed
    from trainwise.calibration.timing import FULL, QUICK

    found = retimed(torch.device("cpu"), _fitted(measured), QUICK if measured.get("quick") else FULL)
    return {"now_s": {f"{p['batch_size']}x{p['seq_len']}": p["end_s"] for p in found["steps"]},
            "calibrated_s": calibrated_steps(measured), "ratio": found["ratio"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, required=True, help="a CPU profile written by `trainwise calibrate`")
    args = parser.parse_args(argv)
    try:
        measured = json.loads(args.profile.read_text()).get("measured") or {}
    except (OSError, ValueError) as error:
        parser.error(f"--profile: cannot read {args.profile}: {error}")
    if not calibrated_steps(measured):
        parser.error(f"--profile: {args.profile} has no reference training steps (a CPU profile from "
                     "`trainwise calibrate` has them)")
    print(json.dumps(time_now(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
