"""What this installation must have to run a plan here: optional packages and the GPUs
that are visible. `estimate` predicts for a device that may be elsewhere and skips these;
`train`, `bench` and the out-of-memory advice, which run (or suggest running) the plan on
this machine, refuse what cannot start here."""

from __future__ import annotations

import importlib.util

from trainwise.common.errors import InputError


def installed(package: str) -> bool:
    """Whether `package` can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_installation(plan, device_kind: str) -> None:
    """InputError naming the flag when `plan` needs a package or GPUs this machine lacks
    (`device_kind` is "cpu" or "cuda", where the plan would run)."""
    if plan.optim == "adamw-8bit" and not installed("bitsandbytes"):
        raise InputError("--optim", "adamw-8bit needs the bitsandbytes package, which is not installed here "
                                    "(pip install bitsandbytes); use adamw or adafactor")
    if plan.classic != "none" and device_kind == "cuda" and visible_gpus() < 2:
        raise InputError("--classic", f"{plan.classic} spreads one process over several GPUs; this machine has "
                                      f"{visible_gpus()} visible: drop --classic")
