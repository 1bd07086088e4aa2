"""Build the unmodified `transformers` model for a ModelSpec, on any device.

On the ``meta`` device nothing is allocated and random initialisation is skipped, so
even a 405B-parameter model builds in well under a second with no memory. On a real
device the model is initialised as `transformers` does it, so ``torch.manual_seed``
makes it reproducible.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

import torch
from torch import nn

from trainwise.models.function_models import call_model_function
from trainwise.models.spec import ModelSpec
from trainwise.models.tasks import auto_class, head_model_class
from trainwise.common.errors import InputError

ATTENTION_IMPLEMENTATIONS = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}


@dataclass(frozen=True)
class BuiltModel:
    """A built model and how its attention was set up.

    attention_requested  what the caller asked for: "eager", "sdpa" or "flash"
    attention_used       the ``attn_implementation`` the model was built with; None for
                         model functions, whose attention is their own
    notes                one line per substitution made, e.g. flash -> sdpa on meta
    """

    model: nn.Module
    attention_requested: str
    attention_used: str | None
    notes: tuple[str, ...] = ()


def build_model(
    spec: ModelSpec,
    device: str | torch.device = "meta",
    dtype: torch.dtype = torch.float32,
    attention: str = "sdpa",
    *,
    batch_size: int = 1,
    seq_len: int = 128,
) -> nn.Module:
    """Build `spec`'s model on `device` with parameters in `dtype`.

    `attention` is "eager", "sdpa" or "flash" (see `build_model_with_notes` for what was
    substituted). `batch_size` and `seq_len` (tokens) are passed only to model functions.
    """
    return build_model_with_notes(spec, device, dtype, attention, batch_size=batch_size, seq_len=seq_len).model


def build_model_with_notes(
    spec: ModelSpec,
    device: str | torch.device = "meta",
    dtype: torch.dtype = torch.float32,
    attention: str = "sdpa",
    *,
    batch_size: int = 1,
    seq_len: int = 128,
) -> BuiltModel:
    """Like `build_model`, also saying which attention kernel was really used and why."""
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise InputError("--attention", f"unknown attention '{attention}'; allowed: {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    device = torch.device(device)
    if spec.source == "function":
        model, _ = call_model_function(spec.function, batch_size, seq_len, device)
        return BuiltModel(model.to(dtype=dtype), attention, None)
    head_class = auto_class(spec.task)
    implementation, notes = _attention_implementation(spec, attention, device)
    config = copy.deepcopy(spec.config)  # from_config writes dtype and attention into it
    # Under a meta default device transformers itself skips the random initialisation.
    with torch.device(device):
        model = head_class.from_config(
            config, dtype=dtype, attn_implementation=implementation, trust_remote_code=spec.trust_remote_code
        )
    return BuiltModel(model, attention, implementation, notes)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _attention_implementation(spec: ModelSpec, attention: str, device: torch.device):
    """Pick the ``attn_implementation`` string and explain any substitution."""
    model_class = head_model_class(spec.config, spec.task)
    notes = []
    if attention == "flash":
        supported = model_class is None or getattr(model_class, "_supports_flash_attn", False)
        if device.type == "meta" and supported:  # an estimate: trace the flash kernel itself
            from trainwise.models.flash_trace import register

            return register(), tuple(notes)
        if device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
            where = f"the {device.type} device" if device.type != "cuda" else "this machine (no flash_attn package)"
            notes.append(f"flash attention is unavailable on {where}; built with sdpa, flash was requested")
            attention = "sdpa"
        elif model_class is not None and not getattr(model_class, "_supports_flash_attn", False):
            notes.append(f"{spec.family} does not support flash attention; built with sdpa")
            attention = "sdpa"
    if attention == "sdpa" and model_class is not None and not getattr(model_class, "_supports_sdpa", False):
        notes.append(f"{spec.family} does not support sdpa attention; built with eager")
        attention = "eager"
    return ATTENTION_IMPLEMENTATIONS[attention], tuple(notes)
