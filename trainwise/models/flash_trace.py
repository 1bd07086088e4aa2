"""`--attention flash` on fake tensors: the kernel the run will use, so the estimate prices it.

A run with `--attention flash` builds the model with transformers' `flash_attention_2`,
which calls the flash-attn package; neither the package nor a CUDA device is there when
the estimate traces a step. The estimate builds the model with this stand-in instead,
registered under its own name in transformers' attention (and mask) registries. It does
what transformers' flash path does before the kernel (queries, keys and values moved to
the kernel's (batch, seq, heads, head_dim) layout; fp32 inputs cast to the autocast dtype;
flash runs only in fp16 or bf16, so an fp32 plan is refused before: models/attention.py) and calls PyTorch's own FlashAttention-2 kernel,
`aten._flash_attention_forward`, whose fake kernel and backward keep what flash-attn keeps:
the half-precision inputs, the output and one fp32 log-sum-exp per query row and head (no
seq x seq matrix). Its FLOPs are counted in that layout (trace/flops_formulas.py: PyTorch's
own formula for the op reads it as SDPA's).

What it leaves out: a padded batch, which flash-attn unpads (variable-length kernel): the
stand-in computes the padding too, as sdpa does (an upper bound).
"""

from __future__ import annotations

import torch
from transformers.integrations.flash_attention import get_target_dtype

KERNEL = torch.ops.aten._flash_attention_forward  # looked up per call (a test counts the calls)
NAME = "trainwise_fa2_trace"  # no "flash" in it: transformers would look for a flash package


def flash_attention_traced(module, query, key, value, attention_mask, dropout: float = 0.0,
                           scaling: float | None = None, sliding_window: int | None = None,
                           softcap: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature; returns (output (b, s, h, d), None)."""
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim != head_dim:
        value = torch.nn.functional.pad(value, [0, head_dim - v_head_dim])
    target = get_target_dtype(query, module)  # transformers' cast of fp32 inputs (to the autocast dtype)
    if target is not None:
        query, key, value = query.to(target), key.to(target), value.to(target)
    causal = module.is_causal if is_causal is None else is_causal
    window = sliding_window - 1 if sliding_window else -1
    output = KERNEL(
        query, key, value, None, None, query.shape[1], key.shape[1], dropout if module.training else 0.0,
        bool(causal), False, scale=scaling, window_size_left=window, window_size_right=0 if causal else -1)[0]
    if v_head_dim != head_dim:
        output = output[..., :v_head_dim]
    return output, None


def register() -> str:
    """Register the stand-in with transformers (idempotent); its attn_implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, flash_attention_traced)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME
