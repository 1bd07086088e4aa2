"""Gradient accumulation gives the gradient of the large batch, and holds back DDP syncs."""

import contextlib

import torch
from torch import nn

from trainwise.engine.accumulation import gradient_sync
from trainwise.engine.parallelize import parallelize
from trainwise.engine.train_step import training_step
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import Plan


def _gradients_after_one_step(batch_size: int, grad_accum: int, samples: dict) -> dict:
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")
    model = build_model(spec, "cpu", attention="eager")
    plan = Plan(batch_size=batch_size, grad_accum=grad_accum, seq_len=16, device="cpu", max_grad_norm=0.0, lr=0.0)
    setup = parallelize(model, plan, torch.device("cpu"), total_steps=1)
    micro = [{k: v[i:i + batch_size] for k, v in samples.items()} for i in range(0, 4, batch_size)]
    captured = {}
    # Read the accumulated gradients just before the optimizer step zeroes them.
    original_step = setup.optimizer.step

    def capture(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in setup.model.named_parameters() if p.grad is not None})
        return original_step(*args, **kwargs)

    setup.optimizer.step = capture
    training_step(setup, iter(micro), plan, skip_non_finite=False)
    return captured


def test_grad_accumulation_matches_large_batch():
    spec = resolve_model("tiny-llama")
    samples = example_batch(spec, 4, 16, generator=torch.Generator().manual_seed(1))
    large = _gradients_after_one_step(4, 1, samples)
    accumulated = _gradients_after_one_step(1, 4, samples)
    assert large.keys() == accumulated.keys() and large
    for name in large:
        torch.testing.assert_close(accumulated[name], large[name], rtol=1e-4, atol=1e-6)


class _FakeDDP(nn.Module):
    def __init__(self):
        super().__init__()
        self.syncing = True
        self.log = []

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        yield
        self.syncing = True


def test_gradient_sync_is_held_back_until_the_last_micro_batch():
    model = _FakeDDP()
    states = []
    for last in (False, False, True):
        with gradient_sync(model, enabled=last):
            states.append(model.syncing)
    assert states == [False, False, True]
