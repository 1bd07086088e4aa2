"""Grouped-query attention is priced as the kernel runs it, whatever torch release counts it."""

import pytest
import torch

from trainwise.trace import op_costs


def _strict(formula):
    """PyTorch's formula as releases before 2.13 have it: equal head counts or an error."""
    def strict(query, key, value, *rest):
        if not query[1] == key[1] == value[1]:
            raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
        return formula(query, key, value, *rest)
    return strict


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
                    reason="this torch has no CPU flash attention kernel")
def test_grouped_query_attention_counts_the_work_of_query_heads(monkeypatch):
    monkeypatch.setattr(op_costs, "sdpa_flop_count", _strict(op_costs.sdpa_flop_count))
    batch, heads, kv_heads, seq, dim = 2, 8, 2, 16, 4
    fake = torch._subclasses.fake_tensor.FakeTensorMode()
    with fake:
        query = torch.empty(batch, heads, seq, dim)
        grouped = torch.empty(batch, kv_heads, seq, dim)
        repeated = torch.empty(batch, heads, seq, dim)
    func = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    flops = op_costs.kernel_flops(func, (query, grouped, grouped), {}, None)
    assert flops == op_costs.kernel_flops(func, (query, repeated, repeated), {}, None)
    assert flops == 2 * (2 * batch * heads * seq * seq * dim)  # Q K^T and P V, a multiply-add is 2
