"""Fused projections are stored per part in distributed checkpoints (views, same bytes)."""

import torch

from trainwise.engine.parallel.checkpoint_shapes import to_checkpoint_shapes, to_model_shapes, to_transformers_shapes

FUSED = {"attn.c_attn": 3}


def test_fused_weights_are_stored_per_part_and_come_back_unchanged():
    state = {"h.0.attn.c_attn.weight": torch.arange(24.).view(2, 12), "h.0.attn.c_attn.bias": torch.arange(12.),
             "h.0.attn.c_proj.weight": torch.ones(4, 4)}
    optimizer = {"h.0.attn.c_attn.weight": {"exp_avg": torch.zeros(2, 12), "step": torch.tensor(3.)}}
    stored = to_checkpoint_shapes(state, FUSED)
    assert stored["h.0.attn.c_attn.weight"].shape == (2, 3, 4)
    assert stored["h.0.attn.c_attn.weight"].data_ptr() == state["h.0.attn.c_attn.weight"].data_ptr()  # a view
    assert stored["h.0.attn.c_attn.bias"].shape == (12,) and stored["h.0.attn.c_proj.weight"].shape == (4, 4)
    # Part p of row i is columns p*4 .. p*4+3 of the model's weight: q, k, v side by side.
    assert torch.equal(stored["h.0.attn.c_attn.weight"][1, 2], state["h.0.attn.c_attn.weight"][1, 8:12])
    stored_optimizer = to_checkpoint_shapes(optimizer, FUSED)["h.0.attn.c_attn.weight"]
    assert stored_optimizer["exp_avg"].shape == (2, 3, 4) and stored_optimizer["step"].shape == ()
    back = to_model_shapes(stored, state)
    assert all(torch.equal(back[name], state[name]) and back[name].shape == state[name].shape for name in state)


def test_whole_tensors_get_the_transformers_shapes():
    whole = {"h.0.attn.c_attn.weight": torch.zeros(2, 3, 4), "h.0.attn.c_attn.bias": torch.zeros(3, 4),
             "h.0.mlp.c_fc.weight": torch.zeros(4, 16)}
    plain = to_transformers_shapes(whole, FUSED)
    assert [tuple(t.shape) for t in plain.values()] == [(2, 12), (12,), (4, 16)]
