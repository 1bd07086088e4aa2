"""The techniques a plan uses beyond a plain step, by the short names the plan table shows
and the measured-techniques record (trainwise/hardware/measured.py) keeps."""

from __future__ import annotations


def techniques_of(plan) -> tuple[str, ...]:
    """The plan's techniques whose effect on memory or time the estimate predicts, in a
    fixed order (precision and the batch shape are columns of their own)."""
    checkpointing = ("selective checkpointing" if plan.grad_ckpt_policy == "selective" else "checkpointing") \
        if plan.grad_ckpt else None
    named = [
        (checkpointing is not None, checkpointing),
        (plan.grad_ckpt and plan.grad_ckpt_every > 1, f"checkpointing every {plan.grad_ckpt_every}"),
        (plan.activation_offload, "activation offload"),
        (plan.attention in ("flash", "eager"), f"{plan.attention} attention"),
        (plan.optim in ("adamw-8bit", "adafactor", "sgd"), plan.optim),
        (bool(plan.lora), "lora"),
        (plan.kernels == "liger", "liger"),
        (plan.compile, "compile"),
        (plan.float8, "float8"),
        (plan.loss == "fused", "fused loss"),
        (plan.cpu_offload, "cpu offload"),
    ]
    return tuple(name for uses, name in named if uses)


def describe_checkpointing(plan) -> str:
    """How a plan checkpoints, for a plan line: "grad-ckpt", "grad-ckpt selective every 2"..."""
    words = ["grad-ckpt"]
    if plan.grad_ckpt_policy != "full":
        words.append(plan.grad_ckpt_policy)
    if plan.grad_ckpt_every > 1:
        words.append(f"every {plan.grad_ckpt_every}")
    return " ".join(words)
