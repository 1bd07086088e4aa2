"""The training loop reads nothing back from the device between read points: a step's
loss, gradient norm, skip flag and fp16 scale stay device tensors until the run logs,
evaluates, saves, stops or ends, and are then read together (docs/train.md, "Reading the
device")."""

import json
import math
import traceback
from pathlib import Path

import pytest
from diverging_model import DivergesAtThirdStep
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import trainwise
from trainwise.api.training import train
from trainwise.engine.faults import NonFiniteLoss
from trainwise.engine.parallelize import parallelize
from trainwise.engine.run_config import RunConfig
from trainwise.engine.step_values import StepValues, read_outcomes
from trainwise.engine.train_step import StepOutcome, training_step
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import Plan

PACKAGE = str(Path(trainwise.__file__).parent)
# Frames between a Python call and the dispatch of its op: decorators and wrappers of torch.
_WRAPPERS = ("torch/_dynamo/", "torch/_compile.py", "torch/utils/_python_dispatch.py", "torch/_tensor.py")


class TrainwiseScalarReads(TorchDispatchMode):
    """Counts `aten._local_scalar_dense` (what .item(), float(), bool() and .tolist() of a
    tensor run, a device-to-host copy on a GPU) called from trainwise's own code. Reads
    inside torch's optimizers or the model's code are theirs, not the loop's."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and _caller_is_trainwise():
            self.count += 1
        return func(*args, **(kwargs or {}))


def _caller_is_trainwise() -> bool:
    for frame in reversed(traceback.extract_stack()[:-2]):  # skip this function and __torch_dispatch__
        if not any(wrapper in frame.filename.replace("\\", "/") for wrapper in _WRAPPERS):
            return frame.filename.startswith(PACKAGE)
    return False


def _reads_per_step(plan: Plan, run: RunConfig) -> list[tuple[int, int, bool]]:
    """(step, trainwise reads since the previous step's report, values read) per step."""
    seen, mode = [], TrainwiseScalarReads()

    def on_step(entry):
        seen.append((entry.step, mode.count, entry.outcome is not None))
        mode.count = 0

    # Counting starts when the run is ready to step (the estimate before it traces fake tensors).
    try:
        train("tiny-llama", plan=plan, run=run, on_step=on_step, on_ready=lambda _: mode.__enter__())
    finally:
        mode.__exit__(None, None, None)
    return seen


@pytest.mark.parametrize("knobs, on_nan", [
    (dict(max_grad_norm=1.0), "stop"),
    (dict(max_grad_norm=1.0, optim="adamw-fused", precision="bf16", grad_accum=2), "skip"),
])
def test_steps_between_read_points_read_nothing_and_a_logged_step_reads_its_values(knobs, on_nan):
    plan = Plan(device="cpu", batch_size=2, seq_len=16, **knobs)
    seen = _reads_per_step(plan, RunConfig(steps=4, log_every=2, on_nan=on_nan, data="synthetic"))
    assert [(step, read) for step, _, read in seen] == [(1, False), (2, True), (3, False), (4, True)]
    assert [count for _, count, read in seen if not read] == [0, 0]
    assert all(count >= 1 for _, count, read in seen if read)


def test_read_outcomes_gives_every_pending_step_in_order():
    tensor = torch.tensor
    outcomes = [StepOutcome(tensor(1.5), 0.1, tensor(2.0), tensor(False), None),
                StepOutcome(tensor(float("nan")), 0.2, tensor(float("inf")), tensor(True), None),
                StepOutcome(tensor(3.25, dtype=torch.float64), 0.3, None, False, tensor(1024.0))]
    assert read_outcomes(outcomes) == [
        StepValues(loss=1.5, lr=0.1, grad_norm=2.0, skipped=False, loss_scale=None),
        StepValues(loss=pytest.approx(float("nan"), nan_ok=True), lr=0.2, grad_norm=None, skipped=True,
                   loss_scale=None),  # a skipped step has no gradient norm
        StepValues(loss=3.25, lr=0.3, grad_norm=None, skipped=False, loss_scale=1024.0)]


def test_a_nan_between_read_points_stops_at_the_next_one_naming_its_own_step():
    model = DivergesAtThirdStep()
    with pytest.raises(NonFiniteLoss) as caught:
        train(model, data=[torch.ones(4)], plan=Plan(device="cpu"), run=RunConfig(steps=8, log_every=4))
    assert caught.value.step == 3  # the first non-finite step, though read at step 4
    assert model.calls == 4  # detected at the read point, not later


def test_a_fused_optimizer_skips_a_nan_step_on_the_device():
    model = DivergesAtThirdStep()
    result = train(model, data=[torch.ones(4)], plan=Plan(device="cpu", optim="adamw-fused"),
                   run=RunConfig(steps=5, log_every=5, on_nan="skip"))
    assert result.summary["skipped_steps"] == 3
    assert torch.isfinite(model.weight).all()  # the NaN gradients never reached the weights
    assert math.isnan(result.summary["final_loss"])  # the last loss read


@pytest.mark.gpu
def test_cuda_steps_issue_no_device_to_host_sync():
    """Under torch.cuda.set_sync_debug_mode("error") any synchronising copy or read raises."""
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")
    plan = Plan(device="cuda", batch_size=2, seq_len=32, precision="bf16", optim="adamw-fused",
                max_grad_norm=1.0, pin_memory=True)
    device = torch.device("cuda")
    setup = parallelize(build_model(spec, "cuda", attention=plan.attention), plan, device, 8)
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            batch = example_batch(spec, 2, 32, generator=generator)
            # The model's own causal-mask shortcut reads an attention mask; this checks the loop.
            batch.pop("attention_mask", None)
            yield {key: value.pin_memory() for key, value in batch.items()}

    stream = batches()
    outcomes = [training_step(setup, stream, plan, skip_non_finite=True)]  # first step: state is created
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outcomes += [training_step(setup, stream, plan, skip_non_finite=True) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    values = read_outcomes(outcomes)
    assert all(v.loss == v.loss and v.grad_norm is not None and not v.skipped for v in values)


@pytest.mark.slow
def test_logging_every_fifth_step_logs_the_same_losses_as_logging_every_step(tmp_path):
    """Reading lazily changes when values are read, never what was trained."""
    lines = {}
    for every in (1, 5):
        metrics = tmp_path / f"every-{every}.jsonl"
        train("tiny-llama", plan=Plan(device="cpu", batch_size=1, seq_len=16, max_grad_norm=1.0),
              run=RunConfig(steps=20, log_every=every, metrics=str(metrics), data="synthetic", seed=3))
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        lines[every] = {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "step" in r}
    assert sorted(lines[5]) == [5, 10, 15, 20]
    assert {step: lines[1][step] for step in lines[5]} == lines[5]
