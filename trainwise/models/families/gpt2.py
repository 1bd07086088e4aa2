"""GPT-2: Conv1D projections (weight [in, out]), q, k and v fused in one (`c_attn`).

Tensor parallel splits c_attn and c_fc column-wise (c_attn per part, so every rank holds
the same heads of q, k and v) and both c_proj row-wise; the attention splits c_attn's
output by `split_size` and counts `num_heads`, which a rank divides by tp. The head size
is derived from the hidden size, so a rank's shapes come from rebuilding the projections.
The causal-LM head is vocab-parallel.

Sequence parallel runs ln_1, ln_2 and ln_f on sequence slices; the attention and the MLP
(each called with the hidden states as first positional argument) all-gather their input,
and the row-wise c_proj reduce-scatter theirs back to slices (conv1d_parallel.py). The
position embedding is added before the first block, on the whole sequence. ln_f's output
is gathered before the head, because GPT2Model reshapes it by the whole length."""

from __future__ import annotations

import torch

from trainwise.models.families.base import ModelFamily, PipelineParts, SequenceParallelPlan
from trainwise.models.families.stage import DecoderStage

PARTS = PipelineParts("transformer.h", ("transformer.wte", "transformer.wpe", "transformer.drop"),
                      ("transformer.ln_f", "lm_head"))


class GPT2Stage(DecoderStage):
    """GPT-2: learned position embeddings added on the first stage, dropout after them."""

    parts = PARTS

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        positions = self.positions(tokens_or_hidden)
        if self.is_first:
            hidden = self.transformer.wte(tokens_or_hidden) + self.transformer.wpe(positions)
            hidden = self.transformer.drop(hidden)
        else:
            hidden = tokens_or_hidden
        mask = self.causal_mask(hidden, positions)
        for block in self.blocks():
            hidden = block(hidden, None, mask, position_ids=positions)
        if self.is_last:
            return self.lm_head(self.transformer.ln_f(hidden))
        return hidden


FAMILY = ModelFamily(
    name="gpt2",
    model_types=("gpt2",),
    blocks="h",
    tensor_parallel={"attn.c_attn": "colwise", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise",
                     "mlp.c_proj": "rowwise"},
    transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    fused_projections={"attn.c_attn": 3},
    local_sizes=("attn.split_size", "attn.num_heads"),
    vocab_parallel_head=True,
    sequence_parallel=SequenceParallelPlan(norms=("ln_1", "ln_2"), gather_keyword=(), gather_positional=("attn", "mlp"),
                                           final_norm="ln_f"),
    pipeline=PARTS,
    stage=GPT2Stage,
)
