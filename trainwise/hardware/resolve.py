"""resolve_device: turn the --device value into a Device."""

from __future__ import annotations

import difflib
import re

from trainwise.hardware import detect
from trainwise.common.suggest import closest
from trainwise.hardware.catalog import all_spellings, catalog, find_gpu, gpu_names, normalize_name
from trainwise.hardware.device import Device, catalog_device, cpu_device, generic_cuda_device
from trainwise.common.errors import InputError

FIELD = "--device"


def resolve_device(name: str) -> Device:
    """The Device a --device value names.

    "cpu"; "cuda" (or "cuda:N"): the GPU present, or a generic CUDA device with unknown
    capacity when this machine has none; otherwise a catalog GPU by name or alias,
    ignoring case and separators ("a100_80gb", "H100"). Raises InputError otherwise.
    """
    text = str(name).strip()
    lowered = text.lower()
    if lowered == "cpu":
        return cpu_device()
    cuda = re.fullmatch(r"cuda(?::(\d+))?", lowered)
    if cuda:
        return _present_cuda_device(int(cuda.group(1) or 0))
    gpu = find_gpu(text) if text else None
    if gpu is not None:
        return catalog_device(gpu)
    guess = closest(text, [*(s for gpu in catalog() for s in (gpu.name, *gpu.aliases)), "cpu", "cuda"])
    hint = f"did you mean {guess}? " if guess else ""
    raise InputError(FIELD, f"unknown GPU {text!r}; {hint}known: {', '.join(_known_names(text))}")


def _present_cuda_device(index: int) -> Device:
    present = detect.detect_gpus()
    if not present:
        return generic_cuda_device()
    if index >= len(present):
        raise InputError(FIELD, f"cuda:{index} is not present; this machine has "
                                f"{len(present)} GPU(s): cuda:0..cuda:{len(present) - 1}")
    return present[index]


def _known_names(asked: str) -> list[str]:
    """Every accepted name, the closest matches to `asked` first."""
    spellings = {**all_spellings(), "CPU": "cpu", "CUDA": "cuda"}
    close = difflib.get_close_matches(normalize_name(asked), spellings, n=5, cutoff=0.5)
    ordered: list[str] = []
    for name in [spellings[s] for s in close] + ["cpu", "cuda", *gpu_names()]:
        if name not in ordered:
            ordered.append(name)
    return ordered
