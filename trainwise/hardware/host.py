"""The host machine's CPU, as shown next to a CPU measurement (profiles, results pages)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers ("AMD EPYC (family 26,
    model 2)"), from /proc/cpuinfo where there is one. The numbers are kept because a
    virtual machine may show only a generic name: under "AMD EPYC" two sessions ran the same
    plan search in 42 and 19 s, most likely on two generations that the name could not
    tell apart, and a profile calibrated on one would have been taken for the other."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
        if "model name" in fields:
            numbers = [f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model"))
                       if fields.get(key)]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
