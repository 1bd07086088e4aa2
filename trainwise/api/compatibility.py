"""Every refusal of a request, in one place: `estimate`, `train` and `bench` call
`check_request` before any model is built, so a combination is refused by all of them the
same way (exit 2, one line naming the flag), and `--attention auto` is resolved here.

The rules themselves live with what they are about: the Plan alone
(trainwise/plan/combinations.py), the target device (below), the model's attention
(trainwise/models/attention.py) and this machine's packages and GPUs
(trainwise/hardware/installation.py)."""

from __future__ import annotations

from trainwise.hardware import Device
from trainwise.hardware.installation import check_installation
from trainwise.models import ModelSpec
from trainwise.models.attention import check_flash, pick_attention
from trainwise.models.documents import check_packing, packable_auto_pick
from trainwise.models.task_inputs import fit_task_sequence
from trainwise.plan.combinations import check_combinations
from trainwise.common.errors import InputError, NotSupportedYet
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan
from trainwise.techniques.activation_offload import check_activation_offload
from trainwise.techniques.float8 import check_float8
from trainwise.techniques.kernels import check_kernels
from trainwise.techniques.fused_loss_model import check_fused_loss_layout, check_fused_loss_model


def check_request(plan: Plan, device: Device, spec: ModelSpec | None = None, *,
                  here: bool, world_size: int | None = None) -> tuple[Plan, list[str]]:
    """(the plan with `--attention auto` resolved, notes saying what was picked), or
    InputError for the first rule the request breaks. `here`: the plan runs on this
    machine (train, bench), so its packages and GPUs must be present; `estimate` predicts
    for a device that may be elsewhere. `world_size`: the processes a launched run has
    (default: what the plan names)."""
    plan, notes, _ = check_request_and_layout(plan, device, spec, here=here, world_size=world_size)
    return plan, notes


def check_request_and_layout(plan: Plan, device: Device, spec: ModelSpec | None = None, *,
                             here: bool, world_size: int | None = None) -> tuple[Plan, list[str], Layout]:
    """check_request, with the plan's Layout on `world_size` processes, resolved once for
    the checks and kept for the run."""
    layout = check_combinations(plan, world_size)
    plan, notes = fit_task_sequence(plan, spec)
    check_activation_offload(plan)
    check_device_support(plan, device)
    check_kernels(plan, device, spec, here)
    check_float8(plan, device, here)
    if plan.loss == "fused":
        check_fused_loss_layout(layout, plan.classic)
        if spec is not None:
            check_fused_loss_model(spec.task, spec.config)
    if here:
        check_installation(plan, device.kind)
    if plan.attention != "auto":
        check_flash(plan, device, spec, here)
    else:
        choice, note = packable_auto_pick(plan, *pick_attention(device, spec, here, plan.precision))
        plan, notes = plan.replace(attention=choice), [note, *notes]
    check_packing(plan, spec)  # after auto is resolved: flash packs documents only one row at a time
    return plan, notes, layout


def check_device_support(plan: Plan, device: Device) -> None:
    """Reject what the target device cannot do, naming the knob and the way out."""
    gpu = device.gpu
    if device.kind == "cpu":
        if plan.precision in ("fp16", "tf32"):
            raise InputError("--precision", f"{plan.precision} needs a CUDA device; on cpu use fp32, bf16 or bf16-pure")
        if plan.optim == "adamw-8bit":
            raise InputError("--optim", "adamw-8bit (bitsandbytes) needs a CUDA device; on cpu use adamw or adafactor")
        if plan.classic != "none":
            raise InputError("--classic", f"{plan.classic} spreads one process over several GPUs; on cpu there is "
                                          "one device, so it would change nothing: drop --classic")
        if plan.activation_offload:
            raise InputError("--activation-offload", "moves saved tensors from a GPU to host memory; on cpu they "
                                                     "already are there, so it would change nothing: drop "
                                                     "--activation-offload")
        check_flash(plan, device)
        return
    check_flash(plan, device)
    if gpu is None:
        return
    capability = "{}.{}".format(*gpu.compute_capability)
    if plan.precision in ("bf16", "bf16-pure") and not gpu.supports_bf16:
        raise InputError("--precision", f"{plan.precision} needs compute capability 8.0+; {gpu.name} has {capability}: use fp16")
    if plan.precision == "tf32" and not gpu.supports_tf32:
        raise InputError("--precision", f"tf32 needs compute capability 8.0+; {gpu.name} has {capability}: use fp32 or fp16")


def check_estimate_support(plan: Plan) -> None:
    """Knobs declared in the Plan whose memory effect `estimate` does not model yet."""
    if plan.classic != "none":
        raise NotSupportedYet("--classic", "estimate (it would show one device's figure, not each GPU's)")
