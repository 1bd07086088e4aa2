"""What this installation must have to run a plan here: optional packages and the GPUs
that are visible. `estimate` predicts for a device that may be elsewhere and skips these;
`train`, `bench` and the out-of-memory advice, which run (or suggest running) the plan on
this machine, refuse what cannot start here."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from trainwise.common.errors import InputError


@dataclass(frozen=True)
class Package:
    """An optional package a technique runs on: its module, what pip installs (the
    versions of pyproject.toml's gpu extra, where it lists the package) and the flag."""

    module: str
    pip: str
    flag: str

    @property
    def need(self) -> str:
        """"needs liger-kernel (not installed here: pip install 'liger-kernel>=0.6,<0.9')"."""
        return f"needs {self.pip.split('>')[0]} (not installed here: pip install '{self.pip}')"


LIGER = Package("liger_kernel", "liger-kernel>=0.6,<0.9", "--kernels liger")
TORCHAO = Package("torchao", "torchao>=0.12,<0.19", "--float8")
BITSANDBYTES = Package("bitsandbytes", "bitsandbytes>=0.45", "--optim adamw-8bit")
FLASH_ATTN = Package("flash_attn", "flash-attn", "--attention flash")
# Compiling for a GPU generates Triton kernels (CUDA builds of torch bring it).
TRITON = Package("triton", "triton", "--compile")


def packages_of(plan, device_kind: str) -> tuple[Package, ...]:
    """The optional packages `plan` runs on where it runs (`device_kind`: "cpu" or "cuda")."""
    needed = [(plan.kernels == "liger", LIGER), (plan.float8, TORCHAO), (plan.optim == "adamw-8bit", BITSANDBYTES),
              (plan.attention == "flash", FLASH_ATTN), (plan.compile and device_kind == "cuda", TRITON)]
    return tuple(package for uses, package in needed if uses)


def missing_here(plan, device_kind: str) -> tuple[Package, ...]:
    """The packages `plan` runs on that this machine does not have. For a plan meant for a
    GPU elsewhere, "not installed here" says nothing of the cluster; the user checks there."""
    return tuple(p for p in packages_of(plan, device_kind) if not installed(p.module))


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
