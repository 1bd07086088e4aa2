"""After an out-of-memory crash: what the plan needed and which knob changes would fit.

Candidates change one or two knobs at a time, keeping the global batch (batch x
accumulation) where the batch shrinks, and are ranked by how little they change; each is
checked with `estimate` against the device's memory, so the advice is a prediction for
this model, not a rule of thumb."""

from __future__ import annotations

from trainwise.api.estimate import estimate
from trainwise.hardware.installation import check_installation
from trainwise.models import ModelSpec
from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.common.units import human_bytes

MAX_SUGGESTIONS = 3


def candidate_changes(plan: Plan, device_kind: str) -> list[dict]:
    """Knob changes that lower memory, least disruptive first."""
    changes: list[dict] = []
    if not plan.grad_ckpt:
        changes.append({"grad_ckpt": True})
    batch, accum = plan.batch_size, plan.grad_accum
    while batch > 1:
        batch, accum = batch // 2, accum * 2
        changes.append({"batch_size": batch, "grad_accum": accum})
        if not plan.grad_ckpt:
            changes.append({"batch_size": batch, "grad_accum": accum, "grad_ckpt": True})
    if plan.precision in ("fp32", "tf32"):
        changes.append({"precision": "bf16"})
    if plan.optim in ("adamw", "adamw-fused"):
        changes.append({"optim": "adafactor"})
        if device_kind == "cuda":
            changes.append({"optim": "adamw-8bit"})
    if not plan.lora:
        changes.append({"lora_rank": 16})
        changes.append({"lora_rank": 16, "grad_ckpt": True})
    return changes


def fitting_changes(spec: ModelSpec, plan: Plan, capacity_bytes: int) -> list[tuple[dict, int]]:
    """Up to MAX_SUGGESTIONS (changes, predicted device total in bytes) that fit `capacity_bytes`."""
    fits = []
    for change in candidate_changes(plan, "cuda" if plan.device != "cpu" else "cpu"):
        changed = plan.replace(compile=False, **change)
        try:
            # Only what can run here: the advice is for a rerun on this machine.
            check_installation(changed, "cuda" if plan.device != "cpu" else "cpu")
            result = estimate(spec, changed)
        except InputError:
            continue  # e.g. this device cannot run the changed precision, or a package is missing
        if result.memory.device_total <= capacity_bytes:
            fits.append((change, result.memory.device_total))
            if len(fits) == MAX_SUGGESTIONS:
                break
    return fits


def describe_changes(change: dict) -> str:
    """'--grad-ckpt --batch-size 2' for a change dict."""
    parts = []
    for name, value in change.items():
        flag = "--" + name.replace("_", "-")
        parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def oom_message(spec: ModelSpec | None, plan: Plan, capacity_bytes: int | None, step: int | None) -> str:
    """One paragraph for the user: where it ran out, what was predicted, what would fit."""
    where = f"at step {step + 1}" if step is not None else "while setting up"
    lines = [f"out of memory {where}"]
    if spec is None or capacity_bytes is None:
        return lines[0] + " (no estimate for a model object; try --grad-ckpt, a smaller --batch-size or --precision bf16)"
    try:
        predicted = estimate(spec, plan.replace(compile=False)).memory.device_total
        lines.append(f"predicted need {human_bytes(predicted)} (device total), device has {human_bytes(capacity_bytes)}")
    except InputError:
        pass
    fits = fitting_changes(spec, plan, capacity_bytes)
    if fits:
        lines.append("predicted to fit: " + "; ".join(f"{describe_changes(c)} ({human_bytes(b)})" for c, b in fits))
    else:
        lines.append("no single change is predicted to fit; combine --grad-ckpt, --lora-rank and a smaller --batch-size")
    return "; ".join(lines)
