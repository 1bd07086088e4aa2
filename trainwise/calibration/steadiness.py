"""Whether the machine ran at one speed through a CPU calibration: the two reference
training steps (host_time.py) timed again, the same way, once everything else is measured.

A profile is the machine's speed in the minute it was calibrated. A shared or virtual
machine's speed comes and goes: on this project's 2-core VM the calibration's reference
steps, timed again later the same hour, took 0.72-0.86 x as long as at calibration, and a
profile from such a spell predicts every later step long (or short) by that factor. The
ratio here covers the span between the fit and the end of the calibration only, so a
steady reading does not prove the profile will hold later; an unsteady one says it was
taken while the speed moved, and `busy_warnings` (api/calibrate.py) says so."""

from __future__ import annotations

import statistics
import time

# No torch at import: api/calibrate.py's busy_warnings reads a profile's steadiness, and
# benchmarks read profiles, without measuring anything.

# A fraction: reference steps that moved more than this between the fit and the end make
# the profile suspect. The same limit as a noisy measurement's spread (api/calibrate.py).
STEADY_LIMIT = 0.10


def retimed(device, steps: list[dict], settings) -> dict:
    """{"what", "steps": [{"batch_size", "seq_len", "fitted_s", "end_s"}], "ratio",
    "seconds" (wall, the check's own cost)}: each of `steps` (host_time's points, as
    fitted) timed again now on `device` (a torch device) under `settings`
    (calibration/timing.py), as many steps as the fit timed; the ratio is the geometric
    mean over them of seconds now / seconds at the fit (> 1: the machine slowed down)."""
    from trainwise.calibration.host_time import steps_timed, time_training_steps
    from trainwise.plan.plan import Plan

    found, started = [], time.perf_counter()
    for point in steps:
        size = (point["batch_size"], point["seq_len"])
        plan = Plan(batch_size=size[0], seq_len=size[1], device="cpu")
        end_s, _ = time_training_steps(device, plan, steps=steps_timed(settings, size))
        found.append({"batch_size": size[0], "seq_len": size[1], "fitted_s": point["step_s"], "end_s": end_s})
    return {"what": "the reference training steps timed again at the end of the calibration, against their "
                    "timing when the profile was fitted",
            "steps": found, "ratio": ratio(found), "seconds": round(time.perf_counter() - started, 1)}


def ratio(steps: list[dict]) -> float | None:
    """The geometric mean of end_s / fitted_s over `steps` (None without a usable pair)."""
    pairs = [p["end_s"] / p["fitted_s"] for p in steps if p.get("fitted_s") and p.get("end_s")]
    return statistics.geometric_mean(pairs) if pairs else None


def unsteady_warning(measured: dict) -> str | None:
    """The line a profile's reader is shown when its calibration's reference steps moved
    more than STEADY_LIMIT between the fit and the end; None when steady or not measured
    (a GPU's profile, one calibrated before this check existed)."""
    moved = (measured.get("steadiness") or {}).get("ratio")
    if moved is None or abs(moved - 1.0) <= STEADY_LIMIT:
        return None
    return (f"the machine's speed changed while calibrating: the reference training steps took {moved:.2f} x as "
            f"long at the end as when the profile was fitted (more than {100 * STEADY_LIMIT:.0f} % apart): the "
            "profile may be off; calibrate again when the machine runs steadily")
