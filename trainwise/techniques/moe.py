"""Mixture-of-experts models: train with the router's load-balancing loss.

transformers' MoE models (Mixtral, Qwen-MoE, ...) add `router_aux_loss_coef * aux_loss`
to the returned loss only when `output_router_logits` is on, and their configs ship with
it off (an inference default). Training without it lets the router collapse onto a few
experts, so the recipe turns it on; the tracer sees the same switch."""

from __future__ import annotations

from torch import nn


def enable_router_aux_loss(model: nn.Module) -> bool:
    """Turn on the router loss where the model has one; True if it did."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "router_aux_loss_coef"):
        return False
    config.output_router_logits = True
    return True
