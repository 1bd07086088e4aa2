"""Model families the parallel engine can cut: one module per family, each declaring a
ModelFamily (base.py), and the lookup from a config or model type to its family.

    family = family_of(config)          # or family_of("mistral"); None if unsupported
    family.tensor_parallel              # {module path inside a block: "colwise" | "rowwise"}

Adding a family is one new module here, listed in FAMILIES, plus its tests (see
docs/parallel.md, "Adding a model family")."""

from __future__ import annotations

from trainwise.models.families import bert, gpt2, llama
from trainwise.models.families.base import ModelFamily, PipelineParts, SequenceParallelPlan, replace_submodule

# In the order refusals list them.
FAMILIES: tuple[ModelFamily, ...] = (llama.FAMILY, gpt2.FAMILY, bert.FAMILY)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_of(config_or_model_type) -> ModelFamily | None:
    """The family of a config (by its `model_type`) or of a model type; None if no family
    module describes it."""
    if isinstance(config_or_model_type, str) or config_or_model_type is None:
        model_type = config_or_model_type
    else:
        model_type = getattr(config_or_model_type, "model_type", None)
    return _BY_MODEL_TYPE.get(model_type)


def model_types_with(feature: str) -> list[str]:
    """The model types whose family implements `feature` ("tensor_parallel",
    "sequence_parallel" or "pipeline"), families in FAMILIES order."""
    return [model_type for family in FAMILIES if getattr(family, feature) for model_type in family.model_types]


__all__ = ["FAMILIES", "ModelFamily", "PipelineParts", "SequenceParallelPlan", "family_of", "model_types_with",
           "replace_submodule"]
