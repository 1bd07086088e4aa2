"""Which techniques' effects were ever measured on a GPU class: the record
benchmarks/measured_techniques.py writes from the project's committed GPU runs
(measured_techniques.json, installed with the package; docs/ is not). A GPU class is a
compute capability (H100 and H200 are both 9.0): the kernels a technique runs, and so its
effect, are chosen per capability. `plan` marks the other techniques as predicted only."""

from __future__ import annotations

import functools
import json
from importlib import resources

from trainwise.hardware.device import Device

RECORD = "measured_techniques.json"


@functools.cache
def _classes() -> dict:
    return json.loads(resources.files("trainwise.hardware").joinpath(RECORD).read_text())["classes"]


def device_class(device: Device) -> str | None:
    """The GPU class of `device` ("9.0"), or None where the record says nothing (the CPU, a
    CUDA device whose GPU is unknown)."""
    if device.gpu is None:
        return None
    return "{}.{}".format(*device.gpu.compute_capability)


def never_measured(techniques: tuple[str, ...], device: Device) -> tuple[str, ...] | None:
    """The `techniques` no committed run measured on `device`'s class; None when the device
    has no class (no claim either way)."""
    cls = device_class(device)
    if cls is None:
        return None
    measured = set(_classes().get(cls, {}).get("techniques", ()))
    return tuple(t for t in techniques if t not in measured)


def legend(device: Device) -> str:
    """The line under a table that marks never-measured techniques with †."""
    return (f"† effect predicted, never measured on a compute capability {device_class(device)} GPU "
            f"({device.gpu.name}'s class) in the project's committed GPU runs")
