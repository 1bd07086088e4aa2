"""Calibration of tensor contractions: matmul and attention throughput per dtype.

Matmuls are timed over square shapes and the skinny shapes of a transformer layer
(tokens x hidden times hidden x 3/4 hidden and back), each 2*m*k*n FLOPs, so the fitted
Rate covers the shapes a trace holds. Attention is torch's scaled_dot_product_attention,
causal, forward and backward together, its FLOPs counted as torch.utils.flop_counter
counts them (the same counter the trace uses, which does not halve causal attention)."""

from __future__ import annotations

import contextlib

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from trainwise.calibration.timing import Fit, Settings, fit, measure_sizes, synchronizer

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtypes_to_measure(device: torch.device) -> list[str]:
    """The dtype names the device runs: the CPU fp32 and bf16 (when a bf16 matmul runs),
    a GPU fp32, tf32 (Ampere and newer), bf16 (where supported) and fp16."""
    if device.type == "cpu":
        return ["fp32"] + (["bf16"] if _runs(device, torch.bfloat16) else [])
    names = ["fp32"]
    if torch.cuda.get_device_capability(device) >= (8, 0):
        names.append("tf32")
    if torch.cuda.is_bf16_supported():
        names.append("bf16")
    return names + ["fp16"]


def _runs(device: torch.device, dtype: torch.dtype) -> bool:
    try:
        torch.ones(4, 4, dtype=dtype, device=device) @ torch.ones(4, 4, dtype=dtype, device=device)
        return True
    except RuntimeError:
        return False


@contextlib.contextmanager
def tf32_allowed(on: bool):
    """TF32 tensor cores on or off for CUDA matmuls (and cuDNN) inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def matmul_shapes(device: torch.device, settings: Settings) -> list[tuple[int, int, int]]:
    """(m, k, n) shapes: squares, and a layer's projections at a few hidden sizes."""
    if device.type == "cuda":
        squares, hiddens, tokens = (256, 1024, 2048, 4096, 8192), (1024, 2048, 4096), 4096
    elif settings.quick:
        squares, hiddens, tokens = (32, 128, 256), (64,), 128
    else:
        squares, hiddens, tokens = (64, 128, 256, 512, 768, 1024), (128, 256, 512), 512
    skinny = [shape for h in hiddens for shape in ((tokens, h, 3 * h), (tokens, h, 4 * h), (tokens, 4 * h, h))]
    return [(n, n, n) for n in squares] + skinny


def measure_matmul(device: torch.device, dtype_name: str, settings: Settings) -> Fit:
    """The matmul Rate (FLOPs) of `dtype_name` on `device`."""
    dtype, sync = TORCH_DTYPES[dtype_name], synchronizer(device)

    def case(m: int, k: int, n: int):
        def make():
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(k, n, device=device).to(dtype)
            return lambda: torch.mm(a, b)
        return 2 * m * k * n, make

    cases = [case(*shape) for shape in matmul_shapes(device, settings)]
    with tf32_allowed(dtype_name == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        return fit(measure_sizes(cases, sync, settings))


def attention_shapes(device: torch.device, settings: Settings) -> list[tuple[int, int, int, int]]:
    """(batch, heads, sequence, head dim) shapes over a range of sequence lengths."""
    if device.type == "cuda":
        return [(4, 16, s, 128) for s in (256, 512, 1024, 2048, 4096)]
    if settings.quick:
        return [(1, 2, s, 32) for s in (32, 64, 128)]
    return [(1, 4, s, 64) for s in (64, 128, 256, 512, 1024)]


def attention_flops(shape: tuple[int, int, int, int]) -> int:
    """Forward plus backward FLOPs of one attention call, as torch's flop counter counts them."""
    return sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)


def measure_attention(device: torch.device, dtype_name: str, settings: Settings) -> Fit:
    """The attention Rate (FLOPs, forward and backward) of `dtype_name` on `device`."""
    dtype, sync = TORCH_DTYPES[dtype_name], synchronizer(device)

    def case(shape):
        def make():
            q, k, v = (torch.randn(shape, device=device).to(dtype).requires_grad_() for _ in range(3))
            grad = torch.randn(shape, device=device).to(dtype)

            def step():
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), grad)
            return step
        return attention_flops(shape), make

    cases = [case(shape) for shape in attention_shapes(device, settings)]
    with tf32_allowed(dtype_name == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        return fit(measure_sizes(cases, sync, settings))
