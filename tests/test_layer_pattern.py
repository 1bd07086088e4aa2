"""The layer kinds read from a config, the depths traced for them, and the per-kind reading.

trainwise/trace/layer_pattern.py reads each layer's kind the way transformers builds it;
trainwise/trace/depth.py chooses the traced depths and the weights that read a figure at
full depth. These are checked here without tracing (tests/test_blocks_that_differ.py
compares with full traces)."""

from __future__ import annotations

import random

import pytest
from transformers import AutoConfig

from trainwise.trace.depth import TRACED_BLOCKS, depth_fit, extrapolate_by_kind, extrapolate_int, with_blocks
from trainwise.trace.layer_pattern import LayerPattern, layer_pattern


def _config(family: str, **fields):
    return AutoConfig.for_model(family, **fields)


@pytest.mark.parametrize("family,fields,period,first_kinds", [
    ("gemma3_text", {"num_hidden_layers": 26}, 6, ["sliding_attention"] * 5 + ["full_attention"]),
    ("gemma3_text", {"num_hidden_layers": 12, "sliding_window_pattern": 4}, 4,
     ["sliding_attention"] * 3 + ["full_attention"]),
    ("gemma2", {"num_hidden_layers": 26}, 2, ["sliding_attention", "full_attention"]),
    ("modernbert", {"num_hidden_layers": 22, "global_attn_every_n_layers": 3}, 3,
     ["full_attention", "sliding_attention", "sliding_attention"]),
    ("qwen2_moe", {"num_hidden_layers": 24, "decoder_sparse_step": 2}, 2, ["dense", "sparse"]),
])
def test_the_layer_kinds_and_period_are_those_transformers_builds(family, fields, period, first_kinds):
    config = _config(family, **fields)
    pattern = layer_pattern(config, config.num_hidden_layers)
    assert pattern.period == period
    assert list(pattern.kinds[:period]) == first_kinds
    assert len(pattern.kinds) == config.num_hidden_layers


def test_identical_blocks_keep_the_two_traced_depths_and_their_line():
    fit = depth_fit(_config("llama", num_hidden_layers=32))
    assert fit.uniform and fit.depths == TRACED_BLOCKS
    small, large = 1_000_003, 1_250_017
    assert extrapolate_by_kind([small, large], fit) == extrapolate_int(small, large, *TRACED_BLOCKS, 32)


def test_a_dense_first_layer_needs_no_depth_of_its_own():
    """Qwen-MoE's mlp_only_layers=[0] or DeepSeek's first dense layer: every traced depth
    has it, so it is part of the fixed figure; the blocks after it repeat."""
    fit = depth_fit(_config("qwen2_moe", num_hidden_layers=24, mlp_only_layers=[0]))
    assert fit.depths == TRACED_BLOCKS and fit.uniform


@pytest.mark.parametrize("family,fields,depths", [
    ("gemma3_text", {"num_hidden_layers": 26}, (2, 3, 6)),  # one period: the first full layer is the 6th
    ("gemma2", {"num_hidden_layers": 26}, (2, 3, 4)),
    ("modernbert", {"num_hidden_layers": 22}, (2, 3, 4)),
    ("deepseek_v3", {"num_hidden_layers": 61, "first_k_dense_replace": 3}, (2, 3, 4)),
])
def test_one_more_depth_per_extra_layer_kind(family, fields, depths):
    assert depth_fit(_config(family, **fields)).depths == depths


def test_a_pattern_whose_traces_cost_as_much_as_the_model_is_traced_whole():
    """Gemma 2 with 8 layers would trace 2 + 3 + 4 = 9 blocks."""
    assert depth_fit(_config("gemma2", num_hidden_layers=8)) is None
    assert depth_fit(_config("gemma2", num_hidden_layers=10)) is not None


@pytest.mark.parametrize("seed", range(20))
def test_a_figure_affine_in_the_per_kind_counts_is_read_exactly_at_full_depth(seed):
    """fixed + sum over kinds of count x per-block cost, for random repeating patterns
    (period 2-6, a depth that need not be a whole number of periods) and random costs."""
    rng = random.Random(seed)
    names = ("full_attention", "sliding_attention", "linear_attention")
    period = [rng.choice(names) for _ in range(rng.randint(2, 6))]
    layers = rng.randint(30, 70)
    kinds = tuple(period[i % len(period)] for i in range(layers))
    fixed, cost = rng.randint(0, 10**9), {k: rng.randint(1, 10**7) for k in names}
    pattern = LayerPattern(kinds)

    def figure(depth: int) -> int:
        return fixed + sum(cost[k] * n for k, n in zip(pattern.distinct, pattern.counts(depth)))

    fit = depth_fit(_config("llama", num_hidden_layers=layers, layer_types=list(kinds)))
    assert max(fit.depths) <= 2 * len(period)  # a kind needs two counts: its first two layers at most
    assert extrapolate_by_kind([figure(d) for d in fit.depths], fit) == figure(layers)
    assert extrapolate_by_kind([{"x": figure(d)} for d in fit.depths], fit) == {"x": figure(layers)}


def test_shortening_a_config_keeps_the_first_layers_kinds_and_dense_layer_indices():
    config = _config("qwen2_moe", num_hidden_layers=24, mlp_only_layers=[1, 5, 20])
    shorter = with_blocks(config, 6)
    assert shorter.num_hidden_layers == 6 and shorter.mlp_only_layers == [1, 5]
    gemma = with_blocks(_config("gemma3_text", num_hidden_layers=26), 6)
    assert gemma.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
