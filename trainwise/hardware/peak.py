"""The catalog peak FLOP/s a plan's matmuls run at: what MFU is measured (engine) and
predicted (the step-time model) against."""

from __future__ import annotations

from trainwise.hardware.device import Device

# The catalog key of the peak rate each precision's matmuls run at.
PEAK_KEY = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "bf16-pure": "bf16"}


def peak_flops_for(device: Device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s for the plan's matmul dtype, a label naming it and its source).

    None when the catalog has no peak (the CPU, an unknown GPU): MFU is then not shown
    rather than computed against an invented number."""
    key = PEAK_KEY[precision]
    if device.gpu is None:
        return None, f"no {key} peak FLOP/s for {device.name} in the catalog: MFU not shown"
    peak = device.gpu.peak(key)
    if peak is None:
        return None, f"{device.gpu.name} has no {key} peak in the catalog: MFU not shown"
    return peak, f"{device.gpu.name} dense {key} peak {peak / 1e12:,.0f} TFLOP/s (catalog)"
