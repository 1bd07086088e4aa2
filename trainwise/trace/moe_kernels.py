"""Mixture-of-experts layers on fake tensors.

transformers runs experts with `torch._grouped_mm`, whose shape check only accepts bf16,
while a traced step may hold fp32 weights. transformers ships a fallback op with the same
inputs, outputs and saved tensors (so the same memory) and a shape-only fake kernel; the
tracer routes experts through it. Routing is data dependent, but a grouped matmul's output
is always (tokens x top-k) rows however tokens are routed, so memory does not depend on it."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def traceable_experts():
    try:
        from transformers.integrations import moe
    except ImportError:  # older transformers: experts are plain modules
        yield
        return
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:
        yield
        return
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original
