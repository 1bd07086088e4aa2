"""LoRA adapters through peft: the base weights freeze, small low-rank adapters train."""

from __future__ import annotations

from torch import nn

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan


def apply_lora(model: nn.Module, plan: Plan, task: str | None = None) -> nn.Module:
    """Wrap `model` with LoRA adapters of rank `plan.lora_rank` (peft's LoraConfig).

    `--lora-targets auto`: peft's default modules for the family where it has one, else
    every linear layer but the output head (peft's "all-linear": ViT, Whisper, LLaVA...).
    A head trained from scratch (an image classifier's, a CTC model's) trains in full."""
    from peft import LoraConfig, get_peft_model

    if plan.lora_targets == "auto":
        targets = _auto_targets(model)
    else:
        targets = [t.strip() for t in plan.lora_targets.split(",") if t.strip()]
    head = _FULLY_TRAINED_HEADS.get(task)
    config = LoraConfig(r=plan.lora_rank, lora_alpha=plan.lora_alpha, lora_dropout=0.0,
                        target_modules=targets, task_type=_PEFT_TASKS.get(task),
                        modules_to_save=[head] if head and hasattr(model, head) else None)
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise InputError("--lora-targets", f"{str(err).splitlines()[0]}") from None


# peft's task types keep the task head trainable where that is the usual practice (seq-cls).
_PEFT_TASKS = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS", "seq2seq": "SEQ_2_SEQ_LM", "token-cls": "TOKEN_CLS"}
# Heads without a peft task type that a fine-tune trains in full (they start at random).
_FULLY_TRAINED_HEADS = {"image-cls": "classifier", "ctc": "lm_head"}


def _auto_targets(model: nn.Module) -> str | None:
    """None (peft picks its family default) or "all-linear" where peft has no default."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as FAMILY_DEFAULTS

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return None if model_type in FAMILY_DEFAULTS else "all-linear"
