"""BERT and RoBERTa encoders (the same module names).

Tensor parallel splits query, key, value and the intermediate projection column-wise and
the two output projections row-wise. The head size is derived from the hidden size, so a
rank's shapes come from rebuilding the projections. The heads (masked LM, classifiers)
stay replicated. No sequence or pipeline parallel."""

from __future__ import annotations

from trainwise.models.families.base import ModelFamily

FAMILY = ModelFamily(
    name="bert",
    model_types=("bert", "roberta"),
    blocks="encoder.layer",
    tensor_parallel={"attention.self.query": "colwise", "attention.self.key": "colwise",
                     "attention.self.value": "colwise", "attention.output.dense": "rowwise",
                     "intermediate.dense": "colwise", "output.dense": "rowwise"},
)
