"""Step-time corrections learned by verify, written into the device profile.

A correction is a measured/predicted step-time ratio the time model multiplies its
prediction by: "step:<model>" for that model on this device, else "step" for any plan on
it (trainwise/hardware/profile.py).

Composition. The plans verify ran were predicted with the profile's correction already
applied (the model's key, else "step", else none), so the median ratio r verify measures
is what is left over. The model's new correction is therefore old x r: it stays
measured / uncorrected prediction, and a second verify that finds the prediction right
(r = 1) leaves it as it is. "step" becomes the median of the per-model corrections in the
profile, so a model never verified on this device borrows what the others measured, and
one odd model does not pull it alone.

Where. Into the --profile file when one was given, else the per-user cache file of the
device (default_profile_path). A device predicted from the catalog (no calibration) gets
a cache file holding the catalog figures plus the corrections, marked
measured["kind"] = "corrections over catalog": its rates were not measured here, only the
corrections were, and `trainwise calibrate` replaces the file with a measured profile.
Each write appends a line to measured["verify_history"] (when, model, ratio, runs) so the
corrections can be traced back. Nothing is written when the machine was busy: those
timings say as much about the other work as about the plan."""

from __future__ import annotations

import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from trainwise.hardware.device import Device
from trainwise.hardware.profile import (CORRECTIONS_OVER_CATALOG, DeviceProfile, default_profile_path, profile_for,
                                        write_profile)

DEVICE_KEY = "step"
HISTORY_KEPT = 20  # lines of measured["verify_history"] kept, newest last


def model_key(model: str) -> str:
    return f"{DEVICE_KEY}:{model}"


def applied_correction(profile: DeviceProfile, model: str) -> float:
    """The correction a prediction of `model` on this profile already carries."""
    corrections = profile.corrections
    return corrections.get(model_key(model), corrections.get(DEVICE_KEY, 1.0))


def median_ratio(report) -> float | None:
    """Median measured/predicted step-time ratio over the plans that ran ok."""
    ratios = [entry.step_ratio for entry in report.entries if entry.status == "ok" and entry.step_ratio]
    return statistics.median(ratios) if ratios else None


def apply_corrections(profile: DeviceProfile, report, model: str) -> DeviceProfile:
    """`profile` with the model's correction composed with the report's median ratio and
    "step" recomputed (see the module); unchanged when no plan ran ok."""
    ratio = median_ratio(report)
    if ratio is None:
        return profile
    corrections = dict(profile.corrections)
    corrections[model_key(model)] = round(applied_correction(profile, model) * ratio, 6)
    per_model = [value for key, value in corrections.items() if key.startswith(DEVICE_KEY + ":")]
    corrections[DEVICE_KEY] = round(statistics.median(per_model), 6)
    history = list(profile.measured.get("verify_history", []))
    history.append({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": model,
                    "median_ratio": round(ratio, 6), "plans": sum(e.status == "ok" for e in report.entries),
                    "runs_per_plan": report.repeat, "steps": report.steps})
    measured = {**profile.measured, "verify_history": history[-HISTORY_KEPT:]}
    if profile.source == "catalog":
        measured["kind"] = CORRECTIONS_OVER_CATALOG
    return replace(profile, corrections=corrections, measured=measured)


def record_corrections(report, model: str, device: Device, profile_path: Path | None):
    """Apply the report's ratios to the device's profile and write it (atomically);
    `report` with what was written, or with `corrections_note` saying why nothing was."""
    if report.busy:
        return replace(report, corrections_note=f"corrections not written: {report.busy}")
    if median_ratio(report) is None:
        return replace(report, corrections_note="corrections not written: no plan ran ok")
    profile = profile_for(device, profile_path)
    if profile is None:
        return replace(report, corrections_note=f"corrections not written: {device.name} has no profile to "
                                                "correct (write one with trainwise calibrate)")
    target = Path(profile_path) if profile_path is not None else default_profile_path(device)
    corrected = apply_corrections(profile, report, model)
    written = write_profile(corrected, target)
    keys = (model_key(model), DEVICE_KEY)
    return replace(report, profile_written=written, corrections={k: corrected.corrections[k] for k in keys},
                   corrections_note=_note(profile, corrected, model, written))


def _note(before: DeviceProfile, after: DeviceProfile, model: str, written: Path) -> str:
    key = model_key(model)
    old = before.corrections.get(key)
    change = f"{old:.3f} -> {after.corrections[key]:.3f}" if old is not None else f"{after.corrections[key]:.3f}"
    kind = " (catalog figures + measured corrections)" if before.source == "catalog" else ""
    return (f"step-time correction for {model} on this device: x{change} (measured / predicted); "
            f"for any model: x{after.corrections[DEVICE_KEY]:.3f}; written to {written}{kind}")
