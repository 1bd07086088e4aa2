"""Which attention kernel a run gets: `--attention flash` means flash or a refusal, and
`--attention auto` is the one choice that may pick (flash where it runs, else sdpa, else
eager) and says what it picked.

The same rule serves `estimate` (for a target device that may be elsewhere: no package
check) and `train`/`bench` (here: the flash-attn package must be installed)."""

from __future__ import annotations

from trainwise.hardware import Device
from trainwise.hardware.installation import installed
from trainwise.models.spec import ModelSpec
from trainwise.models.tasks import head_model_class
from trainwise.common.errors import InputError

AUTO_ORDER = ("flash", "sdpa", "eager")


# flash-attn runs in half precision only; transformers hands it fp32 inputs unless autocast casts them
FULL_PRECISIONS = ("fp32", "tf32")


def attention_refusal(choice: str, device: Device, spec: ModelSpec | None = None, here: bool = False,
                      precision: str | None = None) -> str | None:
    """Why `choice` ("flash", "sdpa" or "eager") cannot run for `spec` on `device`, or None.
    `here`: the run happens on this machine, so the kernel's package must be installed.
    `precision`: the plan's, where known (flash needs fp16 or bf16 inputs)."""
    model_class = _model_class(spec)
    if choice == "flash":
        if device.kind == "cpu":
            return "flash needs a CUDA GPU (compute capability 8.0+); on cpu use sdpa or eager"
        if precision in FULL_PRECISIONS:
            return (f"flash runs in fp16 or bf16 only (flash-attn refuses {precision} inputs); use --precision bf16 "
                    "or bf16-pure, or sdpa")
        gpu = device.gpu
        if gpu is not None and not gpu.supports_flash_attention:
            capability = "{}.{}".format(*gpu.compute_capability)
            return f"flash needs compute capability 8.0+; {gpu.name} has {capability}: use sdpa"
        if model_class is not None and not getattr(model_class, "_supports_flash_attn", False):
            return f"{spec.family} has no flash attention in transformers; use sdpa or eager"
        if here and not installed("flash_attn"):
            return "flash needs the flash-attn package, which is not installed here (pip install flash-attn); use sdpa"
    if choice == "sdpa" and model_class is not None and not getattr(model_class, "_supports_sdpa", False):
        return f"{spec.family} has no sdpa attention in transformers; use eager"
    return None


def check_flash(plan, device: Device, spec: ModelSpec | None = None, here: bool = False) -> None:
    """InputError when the plan asks for flash and flash cannot run (never a silent sdpa)."""
    if plan.attention == "flash":
        reason = attention_refusal("flash", device, spec, here, plan.precision)
        if reason:
            raise InputError("--attention", reason)


def pick_attention(device: Device, spec: ModelSpec | None = None, here: bool = False,
                   precision: str | None = None) -> tuple[str, str]:
    """(the kernel `--attention auto` runs, a note saying so and why not the faster ones)."""
    passed_over = []
    for choice in AUTO_ORDER:
        reason = attention_refusal(choice, device, spec, here, precision)
        if reason is None:
            return choice, "; ".join((f"--attention auto picked {choice}", *passed_over))
        passed_over.append(reason.split(";")[0])
    return "eager", "--attention auto picked eager"


def _model_class(spec: ModelSpec | None):
    if spec is None or spec.config is None:
        return None
    return head_model_class(spec.config, spec.task)
