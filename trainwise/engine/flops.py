"""MFU (model FLOPs utilisation) against a catalog peak.

The FLOPs the model needs per step are counted on fake tensors (trainwise/trace/flops.py);
here they meet the measured time and the device's peak rate from the hardware catalog."""

from __future__ import annotations

from trainwise.hardware.peak import peak_flops_for  # noqa: F401 - re-exported for the engine's callers


def mfu(flops_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0.42 = 42 %), None without a peak."""
    if peak is None or peak <= 0:
        return None
    return flops_per_second / peak
