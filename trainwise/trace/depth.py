"""A deep model is traced with a few of its blocks, then read at full depth.

Both the memory estimate (trainwise/estimator/extrapolate.py) and the FLOP count
(trainwise/trace/flops.py) trace 2 and 3 blocks instead of all of them; this module holds
what they share: which depths are traced, how a config is shortened to them, and how the
traced figures are read at full depth.

Blocks that differ by design (trainwise/trace/layer_pattern.py: Gemma's sliding and full
attention layers, interleaved mixture-of-experts...) are read per layer kind: a figure at
depth d is taken to be `fixed + sum over kinds of count(kind, d) x per_block(kind)`, where
count(kind, d) is the number of layers of that kind among the first d (a shortened config
keeps the first layers). With K kinds that is K + 1 unknowns, so K + 1 depths are traced:
2 and 3 as for identical blocks (3 minus 2 is one block of the second layer's kind), then
each next depth that brings a kind not yet separable (Gemma 3's pattern of 5 sliding to 1
full: 6, one period; ModernBERT and Gemma 2: 4). The first block's own extra work (it takes
the embeddings) falls into the fixed part, as every traced depth has it. The figure at full
depth is then a weighted sum of the traced figures (`DepthFit.weights`); with one kind the
weights are those of the line through 2 and 3 blocks, as before."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from fractions import Fraction
from collections.abc import Mapping, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: reading a depth or a spec needs no transformers import
    from transformers import PretrainedConfig

from trainwise.trace.layer_pattern import LayerPattern, layer_pattern

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
    for name in ("layer_types", "mlp_layer_types"):
        value = getattr(shorter, name, None)
        if isinstance(value, list) and len(value) >= blocks:
            setattr(shorter, name, value[:blocks])
    dense_only = getattr(shorter, "mlp_only_layers", None)
    if isinstance(dense_only, list):  # layer indices, not one entry a layer
        shorter.mlp_only_layers = [i for i in dense_only if i < blocks]
    return shorter


def should_extrapolate(blocks: int | None) -> bool:
    return blocks is not None and blocks > EXTRAPOLATE_ABOVE


def extrapolate_int(small: int, large: int, small_blocks: int, large_blocks: int, target_blocks: int) -> int:
    """The affine function through (small_blocks, small) and (large_blocks, large) at target."""
    per_block = (large - small) / (large_blocks - small_blocks)
    return int(round(large + per_block * (target_blocks - large_blocks)))


@dataclass(frozen=True)
class DepthFit:
    """How a stack of `target` blocks is read from traces of fewer: trace each of `depths`
    (block counts, ascending), then the figure at `target` is sum(weights[i] x figure at
    depths[i]) (`extrapolate_by_kind`). `pattern` holds the kind of each layer."""

    depths: tuple[int, ...]
    target: int
    weights: tuple[Fraction, ...]
    pattern: LayerPattern

    @property
    def uniform(self) -> bool:
        """Every block after the first is of one kind: traced at TRACED_BLOCKS and read on
        the line through them, and the 3-block timeline can be written out at full depth
        (trainwise/estimator/extrapolate.py)."""
        return len(set(self.pattern.kinds[1:])) <= 1


def depth_fit(config: PretrainedConfig | None, checkpoint_every: int = 1) -> DepthFit | None:
    """The depths to trace and how to read them at full depth; None when the model is
    traced whole (shallow, no repeated blocks, or a pattern whose traces would cost as many
    blocks as the model has). `checkpoint_every`: --grad-ckpt-every of a checkpointed plan
    (1 otherwise), whose checkpointed and kept blocks are read as two layer kinds."""
    blocks = block_count(config)
    if not should_extrapolate(blocks):
        return None
    pattern = layer_pattern(config, blocks, checkpoint_every)
    depths = _separating_depths(pattern, blocks)
    if depths is None or (len(depths) > len(TRACED_BLOCKS) and sum(depths) >= blocks):
        return None
    return DepthFit(depths, blocks, _weights(pattern, depths, blocks), pattern)


def extrapolate_by_kind(values: Sequence, fit: DepthFit):
    """The figure at `fit.target` from one figure per traced depth (in `fit.depths` order):
    numbers (ints come back rounded to ints, floats as floats) or dicts of them, nested or
    not (each key; a key missing at a depth counts 0 there; other values are taken from
    the deepest)."""
    last = values[-1]
    if isinstance(last, Mapping):
        return {key: extrapolate_by_kind([v.get(key, 0 if _number(value) else {}) for v in values], fit)
                if _number(value) or isinstance(value, Mapping) else value
                for key, value in last.items()}
    total = sum(w * Fraction(v) for w, v in zip(fit.weights, values))
    return float(total) if any(isinstance(v, float) for v in values) else int(round(total))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rows(pattern: LayerPattern, depths) -> list[tuple[int, ...]]:
    return [(1, *pattern.counts(d)) for d in depths]


def _separating_depths(pattern: LayerPattern, blocks: int) -> tuple[int, ...] | None:
    """TRACED_BLOCKS, then each next depth below `blocks` that separates one more unknown,
    until the full depth's counts are a combination of the traced ones (None if they are
    not below full depth). A kind found only where every depth has it (DeepSeek's leading
    dense layers, Qwen-MoE's `mlp_only_layers=[0]`) needs no depth of its own: it is part
    of the fixed figure."""
    target = (1, *pattern.counts(blocks))
    depths = list(TRACED_BLOCKS)
    for depth in range(TRACED_BLOCKS[-1] + 1, blocks):
        rows = _rows(pattern, depths)
        if _rank([*rows, target]) == _rank(rows):
            break
        if _rank([*rows, (1, *pattern.counts(depth))]) > _rank(rows):
            depths.append(depth)
    rows = _rows(pattern, depths)
    return tuple(depths) if _rank([*rows, target]) == _rank(rows) == len(depths) else None


def _weights(pattern: LayerPattern, depths: tuple[int, ...], target: int) -> tuple[Fraction, ...]:
    """w with sum_i w_i x row(depths[i]) = row(target): then for any figure that is affine in
    the per-kind counts, sum_i w_i x figure(depths[i]) = figure(target). The rows are
    independent and row(target) is in their span, so w is unique."""
    rows = _rows(pattern, depths)
    goal = (1, *pattern.counts(target))
    # Gauss-Jordan elimination of rows^T w = goal over exact fractions.
    matrix = [[Fraction(row[i]) for row in rows] + [Fraction(goal[i])] for i in range(len(goal))]
    for col in range(len(rows)):
        pivot = next(r for r in range(col, len(matrix)) if matrix[r][col] != 0)
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        matrix[col] = [x / matrix[col][col] for x in matrix[col]]
        for r in range(len(matrix)):
            if r != col and matrix[r][col] != 0:
                matrix[r] = [x - matrix[r][col] * y for x, y in zip(matrix[r], matrix[col])]
    return tuple(matrix[col][-1] for col in range(len(rows)))


def _rank(rows: list[tuple[int, ...]]) -> int:
    matrix = [[Fraction(x) for x in row] for row in rows]
    rank = 0
    for col in range(len(matrix[0]) if matrix else 0):
        pivot = next((r for r in range(rank, len(matrix)) if matrix[r][col] != 0), None)
        if pivot is None:
            continue
        matrix[rank], matrix[pivot] = matrix[pivot], matrix[rank]
        for r in range(len(matrix)):
            if r != rank and matrix[r][col] != 0:
                factor = matrix[r][col] / matrix[rank][col]
                matrix[r] = [x - factor * y for x, y in zip(matrix[r], matrix[rank])]
        rank += 1
    return rank


def checkpoint_every(plan) -> int:
    """The block period of a plan's checkpointing: --grad-ckpt-every with --grad-ckpt, else 1
    (every block alike)."""
    return plan.grad_ckpt_every if plan.grad_ckpt else 1
