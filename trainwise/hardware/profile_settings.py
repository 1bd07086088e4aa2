"""The settings a CPU profile was measured under, and the refusal of one measured under others.

A CPU's rates depend on how many threads torch runs an op on (2 threads run a large matmul
near twice as fast as 1, and a small element-wise op slower) and on the CPU itself. A
profile predicts the step `trainwise train` times in a process like this one: wall
seconds at this process's thread count (torch's default, or OMP_NUM_THREADS /
torch.set_num_threads), so `calibrate` records the thread count, the clock, the CPU
model and the C allocator's setting (hardware/allocator.py: whether freed memory is kept or
faulted in afresh each step) it measured with, and `estimate`, `plan` and `train --plan auto` refuse a profile
whose settings differ from the present ones (exit 2, naming the setting and how to
calibrate again) rather than predict another machine's step."""

from __future__ import annotations

import os

from trainwise.common.errors import InputError
from trainwise.hardware.allocator import GLIBC_DEFAULT, NOT_GLIBC, allocator_in_force
from trainwise.hardware.host import cpu_model

# The clock every profile is measured with (trainwise/calibration/timing.py).
CLOCK = "wall"


def present_settings() -> dict:
    """{"torch_threads", "clock", "cpu_model", "omp_num_threads", "allocator"} of this
    process: what a calibration here records and what a profile is checked against."""
    import torch

    return {"torch_threads": torch.get_num_threads(), "clock": CLOCK, "cpu_model": cpu_model(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "allocator": allocator_in_force()}


def check_profile_settings(profile, flag: str) -> None:
    """InputError(`flag`) when the CPU profile `profile` (a DeviceProfile) was measured under
    other settings than this process's: another thread count, another clock, another CPU
    model. Settings a profile does not record (older files) are not checked; GPU profiles
    are not either (their rates do not depend on the host's threads)."""
    if profile.kind != "cpu":
        return
    measured, here = profile.measured, present_settings()
    threads = measured.get("torch_threads")
    if threads is not None and int(threads) != here["torch_threads"]:
        omp = here["omp_num_threads"]
        how = f"OMP_NUM_THREADS={omp}" if omp else "torch's default"
        raise InputError(flag, f"{_name(profile)} was calibrated with {threads} CPU threads; this process runs "
                               f"{here['torch_threads']} ({how}), so its step would not be the one predicted: "
                               f"calibrate again under these settings ({_recalibrate(profile)}) or run with "
                               f"OMP_NUM_THREADS={threads}")
    clock = measured.get("clock")
    if clock is not None and clock != here["clock"]:
        raise InputError(flag, f"{_name(profile)} was timed in {clock} seconds; a training step is timed in "
                               f"{here['clock']} seconds: calibrate again ({_recalibrate(profile)})")
    model = measured.get("cpu_model")
    if model is not None and model != here["cpu_model"]:
        raise InputError(flag, f"{_name(profile)} was measured on {model!r}, not on this machine's "
                               f"{here['cpu_model']!r}: calibrate here ({_recalibrate(profile)})")
    # A calibrated profile from before the allocator was recorded ran under the C library's
    # default (a user's MALLOC_* settings then were not recorded: refused, one calibration).
    legacy = NOT_GLIBC if here["allocator"] == NOT_GLIBC else GLIBC_DEFAULT
    allocator = measured.get("allocator", legacy if threads is not None else None)
    if allocator is not None and allocator != here["allocator"]:
        raise InputError(flag, f"{_name(profile)} was measured with the C allocator as {allocator!r}; a CPU run "
                               f"here uses {here['allocator']!r}, which changes a step's time: calibrate again "
                               f"({_recalibrate(profile)})")


def _name(profile) -> str:
    return "the profile" if profile.source in ("", "catalog") else f"the profile {profile.source}"


def _recalibrate(profile) -> str:
    """The calibrate command that rewrites `profile` where it was read from."""
    from trainwise.hardware.profile import default_profile_dir

    source = profile.source
    cached = source and os.path.dirname(os.path.abspath(source)) == str(default_profile_dir().absolute())
    return "trainwise calibrate --device cpu" + ("" if cached or not source else f" --out {source}")
