"""Calibrating again while the machine's speed moves, for the benchmarks that calibrate
before they predict (time_model.py, planner_regret.py).

`trainwise calibrate` ends by timing its two reference training steps again and warns when
they ran more than 10 % apart (trainwise.calibration.steadiness): the profile was then
taken while the machine's speed moved, and its warning tells a user to calibrate again. A
benchmark does what the warning says, at most CALIBRATION_TRIES times, and keeps every try
for its page. Tries are kept or dropped by their steadiness alone, never by how well they
predict. Repeats that spread do not count: every quiet calibration of this project's 2-core
VM has had some measurements spreading over 10 %.
"""

from __future__ import annotations

import time
from typing import Callable

# Calibrations at most, the later ones only where the machine's speed moved during the one
# before (about 45 s each on 2 cores).
CALIBRATION_TRIES = 3


def calibrate_until_steady(calibrate_once: Callable[[int], tuple[object, dict, list[str]]],
                           tries: int = CALIBRATION_TRIES) -> tuple[object, list[dict]]:
    """Run `calibrate_once(try_number)` -> (result, the profile's `measured`, its warnings)
    until a try's speed held or `tries` ran; the last result and every try's record
    ({"calibration_s", "warnings", "unsteady"}), in order."""
    from trainwise.calibration.steadiness import unsteady_warning

    attempts, result = [], None
    for attempt in range(1, tries + 1):
        started = time.perf_counter()
        result, measured, warnings = calibrate_once(attempt)
        attempts.append({"calibration_s": round(time.perf_counter() - started, 1), "warnings": list(warnings),
                         "unsteady": unsteady_warning(measured or {}) is not None})
        if not attempts[-1]["unsteady"]:
            break
    return result, attempts


def tries_text(attempts: list[dict]) -> str:
    """How the profile came about, for a page's sentence: empty after one try."""
    if len(attempts) < 2:
        return ""
    return (f" (the last of {len(attempts)} tries: a calibration during which the machine's speed moved was run "
            "again, as its warning tells a user)")


def tries_lines(attempts: list[dict]) -> list[str]:
    """A page's lines listing every try when there was more than one, each with its warnings."""
    if len(attempts) < 2:
        return []
    lead = ("the machine's speed moved during each but the last" if not attempts[-1]["unsteady"]
            else "the machine's speed moved during every one")
    return ([f"Calibration: {len(attempts)} tries; {lead}:", ""]
            + [f"- try {n} ({a['calibration_s']} s): " + ("; ".join(a["warnings"]) or "no warning")
               for n, a in enumerate(attempts, 1)] + [""])
