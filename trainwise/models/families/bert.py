"""BERT and RoBERTa encoders (the same module names).

Tensor parallel splits query, key, value and the intermediate projection column-wise and
the two output projections row-wise. The head size is derived from the hidden size, so a
rank's shapes come from rebuilding the projections. The heads (masked LM, classifiers)
stay replicated.

Sequence parallel: the blocks are post-norm, so each block's two LayerNorms (after the
residual sums of attention.output and output) run on sequence slices; the self-attention
and the intermediate projection all-gather their input, and the two row-wise outputs
reduce-scatter theirs back to slices. The embeddings (word + position + token type,
their LayerNorm and dropout) run whole before the first block, so positions and token
types are the real ones; the last block's output is gathered for the heads. No pipeline
parallel."""

from __future__ import annotations

from trainwise.models.families.base import ModelFamily, SequenceParallelPlan

FAMILY = ModelFamily(
    name="bert",
    model_types=("bert", "roberta"),
    blocks="encoder.layer",
    tensor_parallel={"attention.self.query": "colwise", "attention.self.key": "colwise",
                     "attention.self.value": "colwise", "attention.output.dense": "rowwise",
                     "intermediate.dense": "colwise", "output.dense": "rowwise"},
    sequence_parallel=SequenceParallelPlan(norms=("attention.output.LayerNorm", "output.LayerNorm"), gather_keyword=(),
                                           gather_positional=("attention.self", "intermediate"), final_norm=None),
)
