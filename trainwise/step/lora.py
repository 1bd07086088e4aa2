"""LoRA adapters through peft: the base weights freeze, small low-rank adapters train."""

from __future__ import annotations

from torch import nn

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan


def apply_lora(model: nn.Module, plan: Plan, task: str | None = None) -> nn.Module:
    """Wrap `model` with LoRA adapters of rank `plan.lora_rank` (peft's LoraConfig)."""
    from peft import LoraConfig, get_peft_model

    targets = None if plan.lora_targets == "auto" else [t.strip() for t in plan.lora_targets.split(",") if t.strip()]
    config = LoraConfig(r=plan.lora_rank, lora_alpha=plan.lora_alpha, lora_dropout=0.0,
                        target_modules=targets, task_type=_PEFT_TASKS.get(task))
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise InputError("--lora-targets", f"{str(err).splitlines()[0]}") from None


# peft's task types keep the task head trainable where that is the usual practice (seq-cls).
_PEFT_TASKS = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS", "seq2seq": "SEQ_2_SEQ_LM"}
