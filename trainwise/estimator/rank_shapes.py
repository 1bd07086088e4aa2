"""The shapes of one rank's model under tensor and pipeline parallel: the config whose
one-device model has them (rank_config), the rebuild of the split projections where a
config cannot state them (rank_reshape), and the workload of a stage without the head
(headless_workload). Which projections are split is the model family's declaration
(trainwise/models/families/), the same the engine splits."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from trainwise.trace.depth import with_blocks
from trainwise.models.families import ModelFamily, family_of, replace_submodule
from trainwise.plan.layout import Layout


def rank_config(config, layout: Layout, blocks: int):
    """The config whose one-device model has this rank's shapes (with rank_reshape's
    changes): tensor parallel divides the vocabulary and, in a family whose head size is a
    config entry (heads_in_config), the heads, key/value heads and MLP width; `blocks` blocks."""
    if config is None:
        return None
    local = with_blocks(config, blocks) if layout.pp > 1 else copy.deepcopy(config)
    if layout.tp > 1:
        local.vocab_size = -(-config.vocab_size // layout.tp)  # rank 0's rows: DTensor gives it the larger share
    family = family_of(config)
    if layout.tp > 1 and family is not None and family.heads_in_config:
        local.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        local.num_attention_heads = config.num_attention_heads // layout.tp
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        local.num_key_value_heads = kv_heads // layout.tp
        local.intermediate_size = config.intermediate_size // layout.tp
    return local


def rank_reshape(config, layout: Layout) -> Callable[[nn.Module], None] | None:
    """What turns a model built from rank_config into this rank's tensor-parallel shapes
    where a config cannot say them (BERT and GPT-2 derive the head size from the hidden
    size and the head count): every projection the engine splits is rebuilt on the meta
    device at its local size, as engine/parallel/tensor_parallel.py cuts it (column-wise:
    output features / tp; row-wise: input features / tp). None where rank_config does it all."""
    family = family_of(config)
    if layout.tp == 1 or family is None or family.heads_in_config:
        return None
    return lambda model: tensor_parallel_shapes(model, family, layout.tp)


HEADLESS_VOCABULARY = 8


def headless_workload(config, reshape: Callable[[nn.Module], None] | None):
    """(config, reshape) of the traced workload of a pipeline stage without the head: the
    head and the loss shrunk to 8 outputs, so that the logits, their gradient and the
    loss's temporaries (which a one-device trace of the rank's blocks would peak on) are
    not counted on a stage that never computes them; the embedding keeps its rows."""
    small = copy.deepcopy(config)
    small.vocab_size = HEADLESS_VOCABULARY

    def reshape_headless(model: nn.Module) -> None:
        if reshape is not None:
            reshape(model)
        old = model.get_input_embeddings()
        model.set_input_embeddings(nn.Embedding(config.vocab_size, old.embedding_dim, padding_idx=old.padding_idx,
                                                device="meta", dtype=old.weight.dtype))
    return small, reshape_headless


def tensor_parallel_shapes(model: nn.Module, family: ModelFamily, tp: int) -> None:
    """Rebuild `model`'s split projections at one rank's shapes, in place (meta tensors)."""
    base = getattr(model, "get_base_model", lambda: model)()
    for block in family.block_list(base):
        for path, kind in family.tensor_parallel.items():
            local = _local_projection(block.get_submodule(path), kind, tp, path in family.transposed)
            replace_submodule(block, path, local)
        family.divide_local_sizes(block, tp)


def _local_projection(module: nn.Module, kind: str, tp: int, conv1d: bool) -> nn.Module:
    """A Linear or a Conv1D (`conv1d`: the family's transposed linear, weight [in, out])
    like `module`, its output (column-wise) or input (row-wise) features divided by tp."""
    weight = module.weight
    in_features, out_features = weight.shape if conv1d else weight.shape[::-1]
    if kind == "colwise":
        out_features //= tp
    else:
        in_features //= tp
    with torch.device("meta"):
        local = type(module)(out_features, in_features) if conv1d else nn.Linear(
            in_features, out_features, bias=module.bias is not None)
    local.to(weight.dtype)
    for param, old in zip(local.parameters(), module.parameters()):
        param.requires_grad_(old.requires_grad)
    return local
