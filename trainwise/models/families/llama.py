"""The Llama family: Llama, Mistral and Qwen2 decoders (the same module names).

Tensor parallel splits q, k, v, gate and up column-wise and o and down row-wise; the
config states the head size, so a rank's shapes are the config's with the head counts and
MLP width divided. Sequence parallel runs the two norms of a block and the final norm on
sequence slices; the attention (called with `hidden_states=`) and the MLP (called with one
positional argument) all-gather their input. The causal-LM head is vocab-parallel."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.models.families.base import ModelFamily, PipelineParts, SequenceParallelPlan
from trainwise.models.families.stage import DecoderStage

PARTS = PipelineParts("model.layers", ("model.embed_tokens",), ("model.norm", "lm_head"))


class LlamaStage(DecoderStage):
    """Llama, Mistral, Qwen2: rotary position embeddings computed on every stage; each block
    gets the mask of its attention kind (full or sliding window), as the model's forward does."""

    parts = PARTS

    def __init__(self, causal_lm: nn.Module, first: int, end: int, is_first: bool, is_last: bool):
        super().__init__(causal_lm, first, end, is_first, is_last)
        self.model.rotary_emb = causal_lm.model.rotary_emb  # buffers only, needed by every stage

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.model.embed_tokens(tokens_or_hidden) if self.is_first else tokens_or_hidden
        positions = self.positions(hidden)
        masks = {}
        rotary = self.model.rotary_emb(hidden, position_ids=positions)
        for index, layer in self.get_submodule(self.parts.blocks).items():
            kind = self.attention_kind(int(index))
            if kind not in masks:
                masks[kind] = self.causal_mask(hidden, positions, kind)
            hidden = layer(hidden, attention_mask=masks[kind], position_embeddings=rotary, position_ids=positions)
        if self.is_last:
            return self.lm_head(self.model.norm(hidden))
        return hidden


FAMILY = ModelFamily(
    name="llama",
    model_types=("llama", "mistral", "qwen2"),
    blocks="model.layers",
    tensor_parallel={"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                     "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                     "mlp.down_proj": "rowwise"},
    heads_in_config=True,
    vocab_parallel_head=True,
    sequence_parallel=SequenceParallelPlan(norms=("input_layernorm", "post_attention_layernorm"),
                                           gather_keyword=("self_attn",), gather_positional=("mlp",),
                                           final_norm="model.norm", head_takes_slices=True),
    pipeline=PARTS,
    stage=LlamaStage,
)
