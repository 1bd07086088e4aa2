"""`--kernels liger` as the estimate traces it: a stand-in for Liger-Kernel patched into the
model the way Liger patches it, for a model built on the meta device (a fake-tensor trace,
where Triton cannot run). The engine on CUDA patches the real Liger (techniques/kernels.py).

Each autograd Function below keeps for backward exactly what Liger's keeps, with the same
shapes and dtypes, and allocates what Liger's kernels allocate (its kernels are the custom
ops of techniques/liger_stand_in_ops.py):

* RMSNorm: keeps its input, its weight and one float32 reciprocal RMS per row (the unfused
  Hugging Face norm also keeps its float32 normalized rows, hidden-size wide); backward
  writes the input's gradient over the incoming one (Gemma 2 and 3: a new tensor).
* gated MLP (SwiGLU, GeGLU): keeps the gate and up projections' outputs and recomputes the
  activation in backward (the unfused MLP also keeps act(gate)); backward overwrites the
  two kept outputs with their gradients.
* rotary embedding: rotates the query and key projections' outputs in place and keeps
  only cos and sin (shared by every layer).
* fused linear cross-entropy (`--loss fused` on a causal LM): trainwise's chunked one
  (techniques/fused_loss.py). It keeps what Liger's keeps, the hidden states' gradient (tokens x
  hidden, their dtype) and the head weight's (vocabulary x hidden, its dtype); its per-chunk
  temporaries differ (docs/estimate.md)."""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass

import torch
from torch import nn

from trainwise.techniques.liger_stand_in_ops import gated_activation_kernel, gated_activation_backward_kernel, \
    rms_norm_backward_kernel, rms_norm_kernel, rope_kernel


@dataclass(frozen=True)
class NormCasting:
    """How Liger runs a family's RMSNorm: `offset` added to the weight, Gemma's all-float32
    casting, and whether backward overwrites the incoming gradient."""

    offset: float = 0.0
    gemma: bool = False
    in_place: bool = True


GEMMA_CASTING = {"gemma": NormCasting(1.0, True, True), "gemma2": NormCasting(1.0, True, False),
                 "gemma3_text": NormCasting(1.0, True, False)}
# The norms Liger patches in every decoder layer (besides the backbone's final `norm`).
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
EXTRA_LAYER_NORMS = {"gemma2": ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
                     "gemma3_text": ("pre_feedforward_layernorm", "post_feedforward_layernorm",
                                     "self_attn.q_norm", "self_attn.k_norm")}


class RMSNormStandIn(torch.autograd.Function):
    """Liger's RMSNorm: keeps (input rows, weight, float32 reciprocal RMS per row)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float, casting: NormCasting):
        rows = x.contiguous().view(-1, x.shape[-1])
        output, rstd = rms_norm_kernel(rows, weight, eps, casting.offset, casting.gemma)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.casting, ctx.shape = casting, x.shape
        return output.view(x.shape)

    @staticmethod
    def backward(ctx, grad_output):
        rows, weight, rstd = ctx.saved_tensors
        grad_rows = grad_output.contiguous().view(rows.shape)
        grad_input = grad_rows if ctx.casting.in_place else torch.zeros_like(grad_rows)
        grad_weight = rms_norm_backward_kernel(grad_rows, rows, weight, rstd, ctx.casting.offset,
                                               ctx.casting.gemma, grad_input)
        return grad_input.view(ctx.shape), grad_weight, None, None


class GatedActivationStandIn(torch.autograd.Function):
    """Liger's SiLU-mul / GELU-mul: keeps the two operands, recomputes act(gate) in backward."""

    @staticmethod
    def forward(ctx, gate, up, activation: str):
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        ctx.activation = activation
        return gated_activation_kernel(gate, up, activation)

    @staticmethod
    def backward(ctx, grad_output):
        gate, up = ctx.saved_tensors
        gated_activation_backward_kernel(grad_output.contiguous(), gate, up, ctx.activation)
        return gate, up, None  # now holding their gradients, as Liger's kernel leaves them


class RotaryStandIn(torch.autograd.Function):
    """Liger's rotary embedding: q and k (batch, heads, seq, head_dim) rotated in their
    (batch, seq, heads, head_dim) storage, in place; keeps cos and sin."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        q_rows, k_rows = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        rope_kernel(q_rows, k_rows, cos, sin, False)
        ctx.save_for_backward(cos, sin)
        return q_rows.transpose(1, 2), k_rows.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        cos, sin = ctx.saved_tensors
        q_rows, k_rows = grad_q.transpose(1, 2).contiguous(), grad_k.transpose(1, 2).contiguous()
        rope_kernel(q_rows, k_rows, cos, sin, True)
        return q_rows.transpose(1, 2), k_rows.transpose(1, 2), None, None


def stand_in_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """The family module's `apply_rotary_pos_emb`, as Liger replaces it."""
    return RotaryStandIn.apply(q, k, cos, sin)


def _norm_forward(self, hidden_states):
    eps = getattr(self, "variance_epsilon", None) or getattr(self, "eps", None) or 1e-6
    return RMSNormStandIn.apply(hidden_states, self.weight, eps, self._liger_casting)


def _gated_mlp_forward(self, x):
    return self.down_proj(GatedActivationStandIn.apply(self.gate_proj(x), self.up_proj(x), self._liger_activation))


@contextlib.contextmanager
def _module_function(module, name: str, replacement):
    """`module.name` replaced for the duration (the attention forward reads it at call time)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def _with_stand_in_rotary(attention: nn.Module) -> None:
    """Liger replaces the family module's `apply_rotary_pos_emb` for the whole process; the
    trace swaps it only while this attention runs (forward, or its recomputation), so
    later estimates without --kernels see the unfused function."""
    family_module = sys.modules[type(attention).__module__]
    original = attention.forward

    def forward(*args, **kwargs):
        with _module_function(family_module, "apply_rotary_pos_emb", stand_in_rotary_pos_emb):
            return original(*args, **kwargs)

    attention.forward = forward


def _submodule(layer: nn.Module, path: str) -> nn.Module | None:
    for name in path.split("."):
        layer = getattr(layer, name, None)
    return layer


def patch_liger_stand_in(model: nn.Module, family: str, arguments: dict, task: str | None) -> nn.Module:
    """Patch the stand-in into `model` (in place; returns it) where Liger's
    apply_liger_kernel_to_<family>(model=model, **arguments) patches its kernels."""
    base = getattr(model, model.base_model_prefix, model)
    casting = GEMMA_CASTING.get(family, NormCasting())
    norms = [base.norm] if arguments.get("rms_norm") else []
    activation = "silu" if arguments.get("swiglu") else "gelu_tanh" if arguments.get("geglu") else None
    for layer in base.layers:
        if arguments.get("rms_norm"):
            norms += [_submodule(layer, path) for path in LAYER_NORMS + EXTRA_LAYER_NORMS.get(family, ())]
        if activation is not None:
            layer.mlp._liger_activation = activation
            layer.mlp.forward = types.MethodType(_gated_mlp_forward, layer.mlp)
        if arguments.get("rope"):
            _with_stand_in_rotary(layer.self_attn)
    for norm in filter(None, norms):
        norm._liger_casting = casting
        norm.forward = types.MethodType(_norm_forward, norm)
    if arguments.get("fused_linear_cross_entropy"):
        from trainwise.techniques.fused_loss_model import apply_fused_loss

        model = apply_fused_loss(model, task)
    return model
