"""A deep model is traced with a few of its identical blocks, then read at full depth.

Both the memory estimate (trainwise/estimate/extrapolate.py) and the FLOP count
(trainwise/trace/flops.py) trace 2 and 3 blocks instead of all of them; this module holds
what they share: which depths are traced, how a config is shortened to them, and the line
through two depths' figures."""

from __future__ import annotations

import copy

from transformers import PretrainedConfig

# Traced block counts. Two blocks, not one, as the first block of a stack can differ (it
# receives the embeddings and, under checkpointing, its input is not another block's output).
TRACED_BLOCKS = (2, 3)
# Below this many blocks a full trace is cheap enough.
EXTRAPOLATE_ABOVE = 4


def block_count(config: PretrainedConfig | None) -> int | None:
    """Number of repeated blocks, or None when extrapolation does not apply (unequal
    encoder/decoder stacks, per-layer settings we cannot shorten, model functions)."""
    if config is None:
        return None
    if getattr(config, "is_encoder_decoder", False):
        encoder, decoder = getattr(config, "num_layers", None), getattr(config, "num_decoder_layers", None)
        return encoder if encoder is not None and encoder == decoder else None
    return getattr(config, "num_hidden_layers", None)


def with_blocks(config: PretrainedConfig, blocks: int) -> PretrainedConfig:
    """A copy of `config` with `blocks` repeated blocks (per-layer lists cut to match)."""
    shorter = copy.deepcopy(config)
    if getattr(config, "is_encoder_decoder", False):
        shorter.num_layers = blocks
        shorter.num_decoder_layers = blocks
    else:
        shorter.num_hidden_layers = blocks
    for name in ("layer_types", "mlp_only_layers"):
        value = getattr(shorter, name, None)
        if isinstance(value, list) and len(value) >= blocks:
            setattr(shorter, name, value[:blocks])
    return shorter


def should_extrapolate(blocks: int | None) -> bool:
    return blocks is not None and blocks > EXTRAPOLATE_ABOVE


def extrapolate_int(small: int, large: int, small_blocks: int, large_blocks: int, target_blocks: int) -> int:
    """The affine function through (small_blocks, small) and (large_blocks, large) at target."""
    per_block = (large - small) / (large_blocks - small_blocks)
    return int(round(large + per_block * (target_blocks - large_blocks)))
