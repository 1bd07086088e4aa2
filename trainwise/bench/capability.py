"""Whether this machine can run a plan at all: a row it cannot run is shown as skipped,
with the reason, before any process is started."""

from __future__ import annotations

import importlib.util

from trainwise.plan.plan import Plan


def skip_reason(plan: Plan, device_type: str, has_bf16: bool = True) -> str | None:
    """Why `plan` cannot run on a `device_type` ('cpu'/'cuda') device here, or None."""
    if device_type == "cpu":
        if plan.precision in ("fp16", "tf32"):
            return f"{plan.precision} needs a CUDA GPU (no fp16 loss-scaling or TF32 path on cpu)"
        if plan.optim == "adamw-8bit":
            return "8-bit AdamW (bitsandbytes) needs a CUDA GPU"
        if plan.attention == "flash":
            return "flash attention needs a CUDA GPU"
    if plan.optim == "adamw-8bit" and importlib.util.find_spec("bitsandbytes") is None:
        return "8-bit AdamW needs the bitsandbytes package (pip install bitsandbytes)"
    if plan.attention == "flash" and importlib.util.find_spec("flash_attn") is None:
        return "flash attention needs the flash-attn package"
    if plan.precision in ("bf16", "bf16-pure") and device_type == "cuda" and not has_bf16:
        return "bf16 needs compute capability 8.0+"
    return None
