"""`--verify K`, `--verify-steps N`, `--verify-repeat R`: the flags `plan` and `train --plan
auto` share to run the top K plans on this machine before choosing one."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainwise.common.errors import InputError

DEFAULT_REPEAT = 3
# Timed steps per run after the warm-up (the default --verify-steps, shown in --help): a GPU
# step of a small plan is milliseconds, so it gets more; a CPU run stays short (its
# memory-probe step comes on top, untimed).
TIMED_STEPS = {"cpu": 2, "cuda": 8}


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("verify (runs plans on this machine)")
    group.add_argument("--verify", metavar="K", default=None,
                       help="run the top K plans for a few steps each, in fresh processes on this machine, "
                            "print predicted vs measured step time and peak memory, recommend the measured "
                            "best, and write the measured/predicted step-time ratio into the device profile")
    group.add_argument("--verify-steps", metavar="N", default=None,
                       help="optimizer steps per run, the first (two with --compile) untimed "
                            f"(default: warm-up + {TIMED_STEPS['cpu']} + the memory-probe step on a CPU, "
                            f"warm-up + {TIMED_STEPS['cuda']} on a GPU)")
    group.add_argument("--verify-repeat", metavar="R", default=str(DEFAULT_REPEAT),
                       help=f"runs per plan; the median is reported with the spread (default: {DEFAULT_REPEAT})")


def verify_count(args) -> int:
    """K from --verify (0 when not given); an InputError for anything but a whole number >= 1.
    Call it before the search so a bad value is refused before any long work."""
    if getattr(args, "verify", None) is None:
        return 0
    count = _whole(args.verify, "--verify", "the number of top plans to run, 1 or more")
    _whole(args.verify_repeat, "--verify-repeat", "runs per plan, 1 or more")
    if args.verify_steps is not None:
        _whole(args.verify_steps, "--verify-steps", "optimizer steps per run, 1 or more")
    return count


def run_verify_from_args(args, model: str, candidates: list, device, profile_path: Path | None):
    """Verify the top --verify K of `candidates` (ranked, best first) on `device` and print
    the table (to stderr under --json); returns the VerifyReport."""
    from rich.console import Console

    from trainwise.cli.render_verify import render_verify
    from trainwise.cli.progress_bar import progress_bar
    from trainwise.api.verify import verify_plans

    count = verify_count(args)
    if count == 0:
        raise InputError("--verify", "not given: nothing to verify")
    console = Console(stderr=bool(getattr(args, "json", False)))
    if not console.is_terminal:
        console.width = max(console.width, 200)  # a log file has room for the whole table
    chosen = list(candidates[:count])
    if len(chosen) < count:
        console.print(f"--verify {count}: only {len(chosen)} plan(s) fit, verifying those", highlight=False,
                      markup=False)
    steps = int(args.verify_steps) if args.verify_steps is not None else None
    with progress_bar() as progress:
        report = verify_plans(model, chosen, device, steps=steps, timed_steps=TIMED_STEPS,
                              repeat=int(args.verify_repeat),
                              task=getattr(args, "task", None), profile_path=profile_path, progress=progress)
    render_verify(report, console)
    return report


def _whole(text, field: str, allowed: str) -> int:
    try:
        value = int(str(text))
    except ValueError:
        raise InputError(field, f"{text!r}: allowed is {allowed}") from None
    if value < 1:
        raise InputError(field, f"{value}: allowed is {allowed}")
    return value
