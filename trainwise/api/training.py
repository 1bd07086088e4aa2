"""`trainwise.api.train`: apply a Plan to an unmodified model and train it.

    from trainwise.api import train
    result = train("tiny-llama", plan=Plan(batch_size=8, seq_len=128, device="cpu"),
                   run=RunConfig(steps=50))
    result.summary["tokens_per_s"], result.predicted["peak_allocated"]  # tokens/s: the whole job's

`model` is a catalog name, a local Hugging Face directory (its weights are loaded when it
has them), a Hub id, `package.module:function`, a ModelSpec, a transformers model you
built (a `PreTrainedModel` with a task head: trained in place, its memory predicted from
its config), or any `nn.Module` whose forward takes a batch dict and returns a loss (then
`data` must be an iterable of such batches). `data` may be a run setting (`"synthetic"`,
a file), an iterable of batch dicts, or a tokenized `datasets.Dataset`, as the Trainer
takes it (engine/data/user_dataset.py):

    model = AutoModelForCausalLM.from_config(config)
    train(model, data=tokenized_dataset, plan=Plan(batch_size=8, seq_len=512, device="cpu"))

The job itself is assembled in trainwise/engine/job.py; this entry point hands it what
needs the estimate: the shared refusals, the predicted memory and the out-of-memory advice.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from trainwise.api.compatibility import check_request_and_layout
from trainwise.api.estimate import estimate
from trainwise.api.oom_advice import oom_message
from trainwise.engine.job import Advisor, TrainResult, device_name_for_estimate, train_job
from trainwise.engine.run import StepLog
from trainwise.engine.run_config import RunConfig
from trainwise.hardware import resolve_device
from trainwise.models import ModelSpec
from trainwise.plan.layout import Layout
from trainwise.plan.plan import Plan

__all__ = ["StepLog", "TrainResult", "check_train_request", "train"]


def train(model: str | ModelSpec | nn.Module = "tiny-llama", data: str | Iterable | None = None,
          plan: Plan | None = None, run: RunConfig | None = None, *, task: str | None = None,
          trust_remote_code: bool = False, device_explicit: bool = True,
          on_step: Callable[[StepLog], None] | None = None,
          on_ready: Callable[[TrainResult], None] | None = None) -> TrainResult:
    """Train `model` with `plan` for `run.steps` optimizer steps; see the module docstring.

    Raises InputError for bad input (exit 2), OutOfMemory when the device runs out
    (exit 3, with the predicted need and the changes predicted to fit)."""
    plan, run = plan or Plan(), run or RunConfig()
    if isinstance(data, str):
        run, data = run.replace(data=data), None
    advisor = Advisor(check_request=check_train_request, predict_memory=_predicted_memory, oom_message=oom_message)
    return train_job(model, data, plan, run, advisor, task=task, trust_remote_code=trust_remote_code,
                     device_explicit=device_explicit, on_step=on_step, on_ready=on_ready)


def check_train_request(plan: Plan, device: torch.device, spec: ModelSpec | None,
                        world_size: int) -> tuple[Plan, list[str], Layout]:
    """The shared refusals (trainwise/api/compatibility.py) for a run of `world_size`
    processes on `device`, here: (the plan with `--attention auto` resolved, notes saying
    what was picked, the plan's Layout on those processes)."""
    return check_request_and_layout(plan, resolve_device(device_name_for_estimate(device)), spec, here=True,
                                    world_size=world_size)


def _predicted_memory(spec: ModelSpec, plan: Plan) -> dict:
    return estimate(spec, plan).memory.to_json()
