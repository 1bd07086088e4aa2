"""fp16 loss scaling: a step whose gradients overflowed is skipped whole (parameters and
optimizer state untouched, the scale backed off), and what that costs in reads: with
`adamw-fused` the optimizer takes GradScaler's overflow flag on the device (no read);
with a non-fused optimizer GradScaler reads the flag once per step to decide whether to
call the optimizer at all (docs/train.md, "Reading the device"). fp16 training needs a
GPU; torch's CPU GradScaler runs the same logic, so the engine's step is checked here."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainwise.engine.schedule import build_scheduler
from trainwise.engine.setup import TrainingSetup
from trainwise.engine.train_step import _clip, _optimizer_step
from trainwise.plan import Plan
from trainwise.techniques.optimizers import build_optimizer

INITIAL_SCALE = 2.0**8


class ScalarReads(TorchDispatchMode):
    """Counts every `aten._local_scalar_dense` (a device-to-host read on a GPU)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _setup(optim: str) -> TrainingSetup:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    plan = Plan(device="cpu", optim=optim, max_grad_norm=1.0)
    optimizer = build_optimizer(plan, model, "cpu")
    scaler = torch.amp.GradScaler("cpu", init_scale=INITIAL_SCALE)
    return TrainingSetup(model, model, optimizer, build_scheduler(optimizer, 10, 0, "constant"), scaler,
                         policy=None, device=torch.device("cpu"))


def _step(setup: TrainingSetup, inputs: torch.Tensor):
    """Backward of the scaled loss, then the engine's clip and optimizer step; (skipped,
    scale used) as the engine returns them, and the reads the step made."""
    setup.scaler.scale(setup.model(inputs).sum()).backward()
    with ScalarReads() as reads:
        _clip(setup, Plan(device="cpu", max_grad_norm=1.0))
        skipped, scale = _optimizer_step(setup, None)
    setup.optimizer.zero_grad(set_to_none=True)
    return skipped, scale, reads.count


@pytest.mark.parametrize("optim, flag_reads", [("adamw-fused", 0), ("adamw", 1)])
def test_an_overflowing_fp16_step_is_skipped_whole_and_a_non_fused_optimizer_reads_its_flag(optim, flag_reads):
    setup = _setup(optim)
    skipped, _, _ = _step(setup, torch.ones(3, 4))  # a finite step creates the optimizer state
    assert not bool(skipped)
    weights = copy.deepcopy(setup.model.state_dict())
    state = copy.deepcopy(setup.optimizer.state_dict()["state"])

    skipped, scale, reads = _step(setup, torch.full((3, 4), float("inf")))
    assert bool(skipped) and float(scale) == INITIAL_SCALE
    assert setup.scaler.get_scale() == INITIAL_SCALE * setup.scaler.get_backoff_factor()
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    after = setup.optimizer.state_dict()["state"]
    for index, entries in state.items():
        for key, value in entries.items():
            assert torch.equal(after[index][key], value), (index, key)  # moments and step count
    # Only the scaler's overflow flag is read on a skipped step: the optimizer did not run.
    assert reads == flag_reads
