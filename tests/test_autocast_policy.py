"""Specification of trainwise.trace.autocast_policy: CUDA autocast emulated on CPU tensors."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from trainwise.techniques.precision import precision_policy
from trainwise.trace.autocast_policy import (
    CPU_ONLY,
    CUDA_POLICY,
    KEEP_CPU_KERNEL,
    LOWER,
    autocast_for_target,
    cuda_autocast_kernels,
    registered_ops,
)

BF16 = precision_policy("bf16", "cuda")
FP16 = precision_policy("fp16", "cuda")


def cuda_autocast(policy=BF16):
    return autocast_for_target(policy, "cuda")


def autocast_cpu_kernel(op: str) -> str:
    table = torch._C._dispatch_dump_table(f"aten::{op}")
    return next(line for line in table.splitlines() if line.startswith("AutocastCPU"))


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


# ---- the table ----------------------------------------------------------------------------


def test_table_names_exactly_the_ops_torch_autocasts_on_cuda():
    # Fails on a torch upgrade that changes CUDA's list: categorise the new ops from
    # ATen/autocast_mode.{h,cpp}.
    assert registered_ops("AutocastCUDA") == set(CUDA_POLICY)


def test_every_op_cpu_autocasts_is_either_in_the_cuda_table_or_run_uncast():
    cpu = registered_ops("AutocastCPU")
    assert cpu - set(CUDA_POLICY) == set(CPU_ONLY)
    assert not set(CPU_ONLY) & set(CUDA_POLICY)


def test_kept_cpu_kernels_are_lower_precision_on_both_devices():
    cpu = registered_ops("AutocastCPU")
    for op in KEEP_CPU_KERNEL:
        assert CUDA_POLICY[op] == LOWER and op in cpu, op


def test_registrations_are_undone_on_exit():
    touched = [op for op in (*CUDA_POLICY, *CPU_ONLY) if op not in KEEP_CPU_KERNEL]
    before = {op: autocast_cpu_kernel(op) for op in touched}
    with cuda_autocast():
        during = {op: autocast_cpu_kernel(op) for op in touched}
    assert all(during[op] != before[op] for op in touched)
    assert {op: autocast_cpu_kernel(op) for op in touched} == before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert bf16(2, 3).softmax(-1).dtype == torch.bfloat16  # plain CPU policy again
        assert torch.cat([bf16(2), bf16(2)]).dtype == torch.bfloat16


# ---- casts under the emulation ------------------------------------------------------------


@pytest.mark.parametrize("policy", [BF16, FP16], ids=["bf16", "fp16"])
def test_casts_follow_cuda_policy(policy):
    low = policy.autocast_dtype
    x = torch.randn(4, 8)
    h = x.to(low)
    w = torch.randn(8, 8, requires_grad=True)
    with cuda_autocast(policy):
        assert nn.functional.linear(x, w).dtype == low
        assert torch.mm(x, w).dtype == low and torch.matmul(x, w).dtype == low
        assert torch.einsum("ij,jk->ik", x, w).dtype == low  # lower on CUDA, not autocast on CPU
        assert torch.mv(x, w[0]).dtype == low
        assert h.softmax(-1).dtype == torch.float32
        assert torch.log_softmax(h, -1).dtype == torch.float32
        assert torch.log_softmax(h, -1, dtype=low).dtype == low  # an explicit dtype is respected
        assert nn.functional.layer_norm(h, (8,)).dtype == torch.float32
        assert nn.functional.rms_norm(h, (8,)).dtype == torch.float32
        assert h.sum().dtype == torch.float32 and h.sum(dim=0).dtype == torch.float32
        assert h.cumsum(0).dtype == torch.float32
        assert h.exp().dtype == torch.float32 and h.rsqrt().dtype == torch.float32
        assert h.pow(2).dtype == torch.float32 and torch.pow(2.0, h).dtype == torch.float32
        assert h.norm().dtype == torch.float32 and h.norm(dim=1).dtype == torch.float32
        assert torch.addcmul(h, h, x).dtype == torch.float32  # promote: widest input
        assert torch.addcmul(h, h, h).dtype == low
        assert h.mean().dtype == low  # not an autocast op on either device
        assert torch.arange(4).cumsum(0).dtype == torch.int64  # ineligible input: untouched
        assert torch.ones(3, dtype=torch.float64).exp().dtype == torch.float64


def test_cat_is_not_autocast_as_on_cuda():
    h, x = bf16(2, 3), torch.randn(2, 3)
    # CUDA has no autocast kernel for cat, so ordinary type promotion decides the dtype.
    assert torch.promote_types(torch.bfloat16, torch.float32) == torch.float32
    with cuda_autocast(), CountCasts() as counter:
        assert torch.cat([h, x]).dtype == torch.float32
        assert torch.cat([h, h]).dtype == torch.bfloat16
        assert torch.stack([h, h]).dtype == torch.bfloat16
    assert counter.casts == []  # no autocast cast of the inputs, as on CUDA
    with torch.autocast("cpu", dtype=torch.bfloat16), CountCasts() as counter:
        torch.cat([h, x])
    assert counter.casts == [(2, 3)]  # CPU autocast's promote policy casts the bf16 input first


def test_cross_entropy_of_bf16_logits_gives_float32_loss():
    logits, target = bf16(4, 10).requires_grad_(), torch.tensor([1, 2, 3, 4])
    with cuda_autocast():
        loss = nn.functional.cross_entropy(logits, target)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p, y = torch.rand(4), torch.rand(4)
    with cuda_autocast(), pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
        nn.functional.binary_cross_entropy(p, y)
    with cuda_autocast():
        assert nn.functional.binary_cross_entropy_with_logits(p.bfloat16(), y).dtype == torch.float32


def test_autocast_disabled_inside_turns_the_emulation_off():
    with cuda_autocast(), torch.autocast("cpu", enabled=False):
        assert bf16(3).exp().dtype == torch.bfloat16


def test_cpu_target_keeps_real_cpu_autocast():
    with autocast_for_target(precision_policy("bf16", "cpu"), "cpu"):
        assert bf16(2, 3).softmax(-1).dtype == torch.bfloat16
        assert "autocast_mode.cpp" in autocast_cpu_kernel("cat")
    with autocast_for_target(precision_policy("fp32", "cuda"), "cuda"):
        assert not torch.is_autocast_enabled("cpu")


class CountCasts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


def test_weights_are_cast_once_per_forward_for_ops_both_devices_autocast():
    lin = nn.Linear(8, 16)
    x = torch.randn(2, 8)
    with cuda_autocast(), CountCasts() as counter:
        lin(x)
        lin(x)
    assert counter.casts.count((16, 8)) == 1  # the weight's bf16 copy comes from autocast's cache


# ---- autograd -----------------------------------------------------------------------------


def saved_dtypes(fn):
    dtypes = []

    def pack(t):
        dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, dtypes


def test_gradients_flow_with_float32_parameter_grads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    with cuda_autocast():
        out, saved = saved_dtypes(lambda: model(x))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
    # layer_norm saves float32 tensors on CUDA (it runs in fp32) where CPU autocast saves bf16.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, saved_cpu = saved_dtypes(lambda: model(x))
    assert saved.count(torch.float32) > saved_cpu.count(torch.float32)


def test_checkpoint_recomputation_follows_cuda_policy_when_kernels_span_the_step():
    lin = nn.Linear(8, 8)
    seen = []

    def block(x):
        y = lin(x).softmax(-1)
        seen.append(y.dtype)
        return y * x  # the product saves y, so backward recomputes it

    x = torch.randn(3, 8, requires_grad=True)
    with cuda_autocast_kernels():  # held over forward and backward
        with cuda_autocast():
            y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        y.float().sum().backward()  # recomputes `block` under the saved CPU autocast state
    assert seen == [torch.float32, torch.float32]
    assert x.grad is not None


@pytest.mark.parametrize("policy", [BF16, FP16], ids=["bf16", "fp16"])
def test_llama_block_forward_backward_on_fake_cpu_tensors(policy):
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with FakeTensorMode():
        model = LlamaForCausalLM(config)
        ids = torch.randint(0, 128, (2, 16))
        with cuda_autocast(policy):
            out, saved = saved_dtypes(lambda: model(input_ids=ids, labels=ids))
        assert out.loss.dtype == torch.float32
        assert out.logits.dtype == policy.autocast_dtype
        out.loss.backward()
        grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert policy.autocast_dtype in saved and torch.float32 in saved
