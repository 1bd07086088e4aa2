"""Every model family module describes the models it names: each path it declares exists in
a tiny model built from that model type's config, tensor parallel names only Linear and
Conv1D projections (Conv1D exactly where the family says transposed), and its pipeline
stages, chained, compute the model's own logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.pytorch_utils import Conv1D

from trainwise.models.families import FAMILIES, family_of

ENCODERS = {"bert", "roberta"}  # built with their masked-LM head; every other type as a causal LM
CASES = [(family, model_type) for family in FAMILIES for model_type in family.model_types]


def _tiny_model(model_type: str) -> nn.Module:
    config = AutoConfig.for_model(model_type, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                  max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    build = AutoModelForMaskedLM if model_type in ENCODERS else AutoModelForCausalLM
    return build.from_config(config).eval()


def _case_id(case) -> str:
    return f"{case[0].name}-{case[1]}"


def test_every_model_type_belongs_to_one_family():
    model_types = [model_type for family in FAMILIES for model_type in family.model_types]
    assert len(model_types) == len(set(model_types))
    assert all(family_of(model_type) is family for family in FAMILIES for model_type in family.model_types)
    assert family_of("t5") is None and family_of(None) is None


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_tensor_parallel_plan_names_the_projections_of_every_block(case):
    family, model_type = case
    model = _tiny_model(model_type)
    blocks = family.block_list(model)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == model.config.num_hidden_layers
    for block in blocks:
        for path, kind in family.tensor_parallel.items():
            projection = block.get_submodule(path)
            assert kind in ("colwise", "rowwise")
            assert isinstance(projection, (nn.Linear, Conv1D)), f"{path} is a {type(projection).__name__}"
            assert isinstance(projection, Conv1D) == (path in family.transposed), path
        for path, parts in family.fused_projections.items():
            assert family.tensor_parallel[path] == "colwise" and parts > 1
            out_features = block.get_submodule(path).nf
            assert out_features == parts * model.config.hidden_size
        for path in family.local_sizes:
            owner, _, name = path.rpartition(".")
            assert isinstance(getattr(block.get_submodule(owner), name), int), path
    assert set(family.transposed) <= set(family.tensor_parallel)
    if family.vocab_parallel_head:
        assert model.get_output_embeddings() is not None
    if family.heads_in_config:  # rank_config divides these entries
        assert model.config.num_key_value_heads and model.config.intermediate_size


@pytest.mark.parametrize("case", [c for c in CASES if c[0].sequence_parallel is not None], ids=_case_id)
def test_sequence_parallel_plan_names_norms_and_sub_blocks_that_exist(case):
    family, model_type = case
    model = _tiny_model(model_type)
    plan = family.sequence_parallel
    block = family.block_list(model)[0]
    for path in plan.norms:
        assert "norm" in type(block.get_submodule(path)).__name__.lower(), path
    for path in plan.gather_keyword + plan.gather_positional:
        assert block.get_submodule(path) is not None
    owner = family.blocks_owner(model)
    if plan.final_norm is None:  # post-norm blocks: each block ends in its own norm
        assert plan.norms[-1].rpartition(".")[0] in dict(block.named_modules())
    else:
        assert "norm" in type(owner.get_submodule(plan.final_norm)).__name__.lower()


@pytest.mark.parametrize("case", [c for c in CASES if c[0].pipeline is not None], ids=_case_id)
def test_pipeline_stages_chained_compute_the_models_logits(case):
    family, model_type = case
    model = _tiny_model(model_type)
    parts = family.pipeline
    assert model.get_submodule(parts.blocks) is family.block_list(model)
    assert model.get_submodule(parts.first[0]) is model.get_input_embeddings()
    assert model.get_submodule(parts.last[-1]) is model.get_output_embeddings()
    assert family.stage.parts is parts
    tokens = torch.randint(0, model.config.vocab_size, (2, 12))
    first = family.stage(model, 0, 1, is_first=True, is_last=False)
    last = family.stage(model, 1, 2, is_first=False, is_last=True)
    with torch.no_grad():
        assert torch.allclose(last(first(tokens)), model(input_ids=tokens).logits, atol=1e-5)
