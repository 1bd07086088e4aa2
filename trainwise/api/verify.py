"""`--verify K`, decided: how many steps each verified plan runs, and the runs themselves
(search/verify.py, each plan in a fresh bench process). The command line reads the flags
(`cli/verify_args.py`) and renders the table."""

from __future__ import annotations

import tempfile
from pathlib import Path

# search/verify.py (and the bench runner, torch) is imported on use: the command line reads
# TIMED_STEPS for its --help before any heavy import.


def verify_plans(model: str, chosen: list, device, *, steps: int | None, timed_steps: dict[str, int], repeat: int,
                 task, profile_path, progress):
    """Run `chosen` (ranked candidates) on `device`: `steps` per run, or the warm-up (two
    steps when a plan compiles) and `timed_steps` of the device's kind (plus the memory-probe step on a CPU); the
    VerifyReport."""
    from trainwise.search.verify import verify_candidates

    warmup = 2 if any(c.plan.compile for c in chosen) else 1
    if steps is None:
        steps = warmup + timed_steps.get(device.kind, timed_steps["cuda"]) + (1 if device.kind == "cpu" else 0)
    with tempfile.TemporaryDirectory(prefix="trainwise-verify-") as workdir:
        return verify_candidates(model, chosen, steps=steps, timing_warmup=warmup, repeat=repeat,
                                 workdir=Path(workdir), task=task, profile_path=profile_path, device=device,
                                 progress=progress)


def check_device_present(device) -> None:
    """Refuse --verify for a device that is not this machine's, before the search."""
    from trainwise.search.verify import check_device_present as check

    check(device)


def report_to_json(report) -> dict:
    from trainwise.search.verify import report_to_json as as_json

    return as_json(report)
