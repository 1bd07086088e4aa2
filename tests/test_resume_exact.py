"""A run stopped and resumed trains exactly as the run that was never stopped: the same
loss at every step, for models with dropout (whose masks come from the global RNG) too.

Each case goes through `trainwise.api.train`, so the whole resume path is exercised: the
restored RNG states, then everything the run sets up before its first step (the data
loader, the metrics file, the memory probe) must leave those states as they were. The
models here all use dropout; one without (tiny-llama, tiny-mixtral) draws nothing random
while training, so it would pass even when a resumed run's RNG stream is shifted."""

import os
import signal

import pytest
import torch

from trainwise.api import train
from trainwise.engine.data import build_data
from trainwise.engine.checkpoint import CHECKPOINTS
from trainwise.engine.preemption import Preempted
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan import Plan

STEPS, STOP_AFTER = 4, 2
# The same process, kernels and batches: a resumed step repeats the arithmetic of the
# uninterrupted one; the tolerance only absorbs float printing, not a different mask.
LOSS_REL_TOL = 1e-6


def _losses(model: str, data: str, run: RunConfig, stop_after: int | None = None) -> list[float]:
    """Per-step losses; with `stop_after`, the run is sent SIGUSR1 during that step, as a
    scheduler preempting the job would."""
    losses = []

    def record(entry):
        losses.append(entry.outcome.loss)
        if entry.step == stop_after:
            os.kill(os.getpid(), signal.SIGUSR1)

    train(model, data, Plan(device="cpu", batch_size=2, seq_len=16), run, on_step=record)
    return losses


@pytest.mark.fault
@pytest.mark.parametrize("model, data", [("tiny-gpt2", "synthetic"), ("tiny-gpt2", "builtin"),
                                         ("tiny-bert", "synthetic"), ("tiny-t5", "synthetic")])
def test_a_preempted_and_resumed_run_repeats_every_loss_of_the_uninterrupted_run(tmp_path, fault_log, model, data):
    uninterrupted = _losses(model, data, RunConfig(steps=STEPS, deterministic=True))

    out = tmp_path / "out"
    run = RunConfig(steps=STEPS, output=str(out), deterministic=True)
    with pytest.raises(Preempted) as stopped:
        _losses(model, data, run, stop_after=STOP_AFTER)
    fault_log.watch(out / CHECKPOINTS / f"step-{STOP_AFTER:08d}")
    resumed = _losses(model, data, run.replace(resume=True))

    assert len(resumed) == STEPS - STOP_AFTER
    assert resumed == pytest.approx(uninterrupted[STOP_AFTER:], rel=LOSS_REL_TOL, abs=0)
    fault_log(kind="fault", case=f"{model} ({data} data) stopped by SIGUSR1 during step {STOP_AFTER} of {STEPS}, "
                                 "then rerun with --resume: the resumed losses equal the uninterrupted run's",
              exit_code=stopped.value.exit_code, message=str(stopped.value).replace(str(out), "OUT"))


@pytest.mark.parametrize("data", ["synthetic", "builtin"])
@pytest.mark.parametrize("workers", [0, 1])
def test_starting_the_micro_batches_draws_nothing_from_the_global_generator(data, workers):
    plan = Plan(device="cpu", batch_size=2, seq_len=16, workers=workers)
    train_data = build_data(RunConfig(data=data), resolve_model("tiny-gpt2"), plan)
    torch.manual_seed(0)
    restored = torch.get_rng_state()
    next(train_data.micro_batches(start=3))
    assert torch.equal(torch.get_rng_state(), restored)
