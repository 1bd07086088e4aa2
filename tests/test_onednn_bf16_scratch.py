"""What the bf16 CPU estimate leaves out: oneDNN's scratchpad per bf16 matmul.

On a CPU whose oneDNN has bf16 kernels (AVX512-BF16, AMX), a bf16 matmul allocates, besides
its output, a scratchpad from PyTorch's CPU allocator, sized by the kernel oneDNN picks for
the instruction set and thread count; the trace sees the output only. With oneDNN capped
below bf16 the matmul allocates its output alone. This holds the explanation docs/estimate.md
gives for the bf16 gaps of tests/test_tasks_beyond_text.py."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch

from onednn_isa import CAN_CAP, WITHOUT_BF16_KERNELS

M, K, N = 64, 128, 64  # the weight gradient of a 64 x 64 projection of tiny-bert at batch 2 x 64 tokens

_ALLOCATIONS = """
import torch
from torch.profiler import ProfilerActivity, profile
a, b = torch.ones({M}, {K}, dtype=torch.bfloat16), torch.ones({K}, {N}, dtype=torch.bfloat16)
a @ b  # the first call also builds oneDNN's kernel; the measured one is a steady-state call
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    out = a @ b
print([e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0])
"""


def _bf16_matmul_allocations(env: dict | None = None) -> list[int]:
    code = _ALLOCATIONS.format(M=M, K=K, N=N)
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=True)
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not CAN_CAP, reason="ONEDNN_MAX_CPU_ISA caps x86 instruction sets only")
def test_without_onednn_bf16_kernels_a_bf16_matmul_allocates_its_output_only():
    assert _bf16_matmul_allocations({"ONEDNN_MAX_CPU_ISA": WITHOUT_BF16_KERNELS}) == [M * N * 2]


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bf16 kernels")
def test_with_onednn_bf16_kernels_a_bf16_matmul_also_takes_a_scratchpad():
    allocations = _bf16_matmul_allocations()
    assert M * N * 2 in allocations and sum(allocations) > M * N * 2, allocations
