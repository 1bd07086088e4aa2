"""`--loss fused`: a Hugging Face causal LM's head and loss computed without full logits.

The model is left as the user wrote it; at run time its `forward` is replaced, on the
instance, by one that runs the model's own backbone (`base_model`, the public body every
Hugging Face model names) for the final hidden states, then the fused linear
cross-entropy with the weight of `get_output_embeddings()`. A head tied to the input
embedding is the same Parameter, so it receives both gradients. Calls without labels go to
the model's own forward (generation, evaluation without labels).

Where the unfused forward does more between the head and the loss (logit softcapping or
scaling, a router loss), the fused one would compute a different loss, so those families
are refused; so are families whose forward has not been checked to be exactly
`loss_function(lm_head(last_hidden_state), labels)` (`VERIFIED_FAMILIES`)."""

from __future__ import annotations

import types

import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.techniques.fused_loss import IGNORE_INDEX
from trainwise.techniques.fused_loss_backends import fused_linear_cross_entropy

# model_type -> checked in transformers 5.23: the causal LM's forward is
# hidden = base_model(...).last_hidden_state; logits = lm_head(hidden); loss_function(logits, labels).
VERIFIED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt2", "gpt_neox")
# Config fields that change the logits after the head (the fused loss would ignore them).
_LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
IMPLEMENTATION_ATTRIBUTE = "_trainwise_loss_implementation"


def check_fused_loss_model(task: str | None, config) -> None:
    """InputError for `--loss fused` on a model it cannot run on (before anything is built)."""
    if task != "causal-lm":
        raise InputError("--loss", f"fused needs a causal-lm model (got task {task}); use --loss default")
    family = getattr(config, "model_type", None)
    changed = [name for name in _LOGIT_CHANGES if getattr(config, name, None) not in (None, 1, 1.0)]
    if changed:
        raise InputError("--loss", f"fused does not apply {', '.join(changed)} to the logits yet ({family}); "
                                   "use --loss default")
    if getattr(config, "router_aux_loss_coef", None) is not None:
        raise InputError("--loss", f"fused does not add the router loss of mixture-of-experts models yet ({family}); "
                                   "use --loss default")
    if family not in VERIFIED_FAMILIES:
        raise InputError("--loss", f"fused is checked for {', '.join(VERIFIED_FAMILIES)}; {family} is not: "
                                   "use --loss default")


def check_fused_loss_layout(layout, classic: str) -> None:
    """InputError for layouts the fused loss does not support yet."""
    if layout.tp > 1:
        raise InputError("--loss", "fused does not support --tp yet (tensor parallel has its own vocab-parallel loss); "
                                   "use --loss default")
    if layout.pp > 1:
        raise InputError("--loss", "fused does not support --pp yet (the last stage computes the loss); "
                                   "use --loss default")
    if classic == "data-parallel":
        raise InputError("--loss", "fused does not support --classic data-parallel (its replicas would call the "
                                   "original model); use --loss default")


def apply_fused_loss(model: nn.Module, task: str | None) -> nn.Module:
    """Give `model` (a Hugging Face causal LM, possibly inside a peft wrapper) the fused loss."""
    inner = getattr(model, "get_base_model", lambda: model)()
    check_fused_loss_model(task, getattr(inner, "config", None))
    head = inner.get_output_embeddings()
    if type(head) is not nn.Linear:  # a LoRA-wrapped head has weights the fused loss would not see
        raise InputError("--loss", f"fused needs a plain linear head; {type(inner).__name__}'s is "
                                   f"{type(head).__name__} (drop lm_head from --lora-targets)")
    inner.forward = types.MethodType(_fused_forward, inner)
    return model


def loss_implementation(model: nn.Module) -> str | None:
    """The fused loss implementation the model last ran ("pytorch-chunked", "liger",
    "cut-cross-entropy"), or None if it never ran one."""
    for module in model.modules():
        implementation = getattr(module, IMPLEMENTATION_ATTRIBUTE, None)
        if implementation is not None:
            return implementation
    return None


def _fused_forward(self, input_ids=None, labels=None, **kwargs):
    """The causal LM's forward with the head and the loss fused (labels given)."""
    if labels is None:
        return type(self).forward(self, input_ids=input_ids, **kwargs)
    num_items = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    kwargs.pop("logits_to_keep", None)
    outputs = self.base_model(input_ids=input_ids, **kwargs)
    hidden = outputs.last_hidden_state
    if shift_labels is None:  # position t predicts token t + 1; the last position predicts nothing
        shift_labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    head = self.get_output_embeddings()
    divisor = None if num_items is None else torch.as_tensor(num_items, device=hidden.device)
    loss, implementation = fused_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), head.weight, head.bias,
        shift_labels.reshape(-1).to(hidden.device), divisor)
    setattr(self, IMPLEMENTATION_ATTRIBUTE, implementation)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=getattr(outputs, "past_key_values", None))
