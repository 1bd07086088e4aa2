"""The trace's CUDA kernel choices: dropout and dropout-carrying attention as CUDA runs them."""

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from trainwise.api import estimate
from trainwise.plan.plan import Plan
from trainwise.trace.cuda_kernels import cuda_kernel_choices


def test_dropout_keeps_a_one_byte_mask_for_a_cuda_target():
    x = torch.randn(4, 8, requires_grad=True)
    with cuda_kernel_choices("cuda"):
        y = F.dropout(x, 0.1, training=True)
        assert type(y.grad_fn).__name__ == "NativeDropoutBackward0"
        assert y.grad_fn._saved_result1.dtype == torch.bool
        assert F.dropout(x, 0.1, training=False) is x  # eval: untouched
    assert type(F.dropout(x, 0.1, training=True).grad_fn).__name__ != "NativeDropoutBackward0"  # restored


def test_attention_with_dropout_takes_the_memory_efficient_kernel():
    """On fake tensors, as in the trace (the kernel has no real CPU implementation)."""
    with FakeTensorMode(), cuda_kernel_choices("cuda"):
        q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
        mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
        assert type(out.grad_fn).__name__ == "ScaledDotProductEfficientAttentionBackward0"
        assert out.grad_fn._saved_attn_bias.dtype == q.dtype  # the boolean mask made additive
        plain = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)  # no dropout: the CPU kernel
        assert type(plain.grad_fn).__name__ != "ScaledDotProductEfficientAttentionBackward0"
        out.sum().backward()
        assert q.grad.shape == q.shape


def test_cpu_targets_are_untouched():
    with cuda_kernel_choices("cpu"):
        assert F.dropout.__module__ == "torch.nn.functional"


def test_bert_cuda_estimate_no_longer_counts_attention_probabilities():
    """With dropout, sdpa on CUDA keeps no batch x heads x seq x seq tensor: its activations
    must be well below eager attention's (measured on an H100: 6.99 vs 10.36 GiB peak at
    bert-large b4 s512; before the fix the estimate gave both 11.75 GiB)."""
    def activations(attention):
        plan = Plan.from_dict({"batch_size": 2, "seq_len": 128, "device": "h100", "attention": attention})
        return estimate("tiny-bert", plan, task="seq-cls").memory.activations

    sdpa, eager = activations("sdpa"), activations("eager")
    heads, seq, layers, batch = 4, 128, 2, 2
    probabilities = batch * heads * seq * seq * 4 * layers  # fp32 softmax output, per layer
    assert eager - sdpa >= probabilities
