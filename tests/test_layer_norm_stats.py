"""A traced layer norm allocates the statistics the real kernel returns.

`native_layer_norm` returns (output, mean, rstd) and autograd keeps mean and rstd for
backward. On the CPU, a bfloat16 input with float32 weights (a float32 LayerNorm fed by a
bf16 matmul under autocast) gets float32 statistics; PyTorch's fake kernel returned them
in bfloat16, so the trace counted half their bytes (trainwise/trace/layer_norm_stats.py)."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.plan.plan import Plan
from trainwise.trace.step_trace import trace_training_step

BATCH, SEQ, WIDTH = 4, 8, 16


class LinearThenNorm(nn.Module):
    """A matmul (bf16 under autocast) feeding a float32 LayerNorm: the mixed-dtype call."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x):
        return self.norm(self.linear(x)).float().square().mean()


def _real_layer_norm_outputs(dtype: torch.dtype) -> list[tuple[torch.dtype, int]]:
    """(dtype, bytes) of what the real CPU kernel returns in the model under autocast:
    output, mean, rstd."""
    model = LinearThenNorm()
    with torch.autocast("cpu", dtype=dtype):
        hidden = model.linear(torch.randn(BATCH, SEQ, WIDTH, requires_grad=True))
        outputs = torch.ops.aten.native_layer_norm(hidden, [WIDTH], model.norm.weight, model.norm.bias, 1e-5)
    return [(t.dtype, t.nbytes) for t in outputs]


def _traced_layer_norm_outputs(precision: str, device: str, input_dtype=torch.float32) -> list[int]:
    with torch.device("meta"):
        model = LinearThenNorm()
    plan = Plan.from_dict({"batch_size": BATCH, "seq_len": SEQ, "precision": precision, "device": device})
    trace = trace_training_step(model, lambda: torch.randn(BATCH, SEQ, WIDTH, dtype=input_dtype), plan, device)
    forward = [r for r in trace.records if r.phase == "forward" and r.op.startswith("native_layer_norm")]
    return sorted(r.nbytes for r in forward)


def test_traced_bf16_layer_norm_keeps_the_statistics_bytes_of_the_real_cpu_kernel():
    real = _real_layer_norm_outputs(torch.bfloat16)
    assert [dtype for dtype, _ in real].count(torch.float32) == 2  # mean and rstd: fp32 on the CPU
    assert _traced_layer_norm_outputs("bf16", "cpu") == sorted(nbytes for _, nbytes in real)


def test_a_cuda_target_keeps_float32_statistics_for_a_bf16_pure_layer_norm():
    """CUDA's kernel returns its accumulate type (float32) whatever the input's dtype; the
    output stays bf16 (the CPU kernel keeps bf16 statistics here, and so does the trace
    for a CPU target)."""
    rows = BATCH * SEQ
    cuda = sorted([rows * 4, rows * 4, rows * WIDTH * 2])  # fp32 mean and rstd, bf16 output
    assert _traced_layer_norm_outputs("bf16-pure", "cuda", torch.bfloat16) == cuda
    bf16 = torch.randn(BATCH, SEQ, WIDTH, dtype=torch.bfloat16), torch.ones(WIDTH, dtype=torch.bfloat16)
    real_cpu = torch.ops.aten.native_layer_norm(bf16[0], [WIDTH], bf16[1], bf16[1], 1e-5)
    assert _traced_layer_norm_outputs("bf16-pure", "cpu", torch.bfloat16) == sorted(t.nbytes for t in real_cpu)
