"""The baseline: the same plan run through the Hugging Face `Trainer`, in its own process.

    python -m trainwise.bench.hf_trainer_worker MODEL --plan P.json --data synthetic
        --steps N --timing-warmup W --metrics M.jsonl --seed S [--task T]

Same model (built from the catalog config with the same seed), same synthetic batches,
same knobs mapped onto `TrainingArguments`, and memory and time measured the way
`trainwise train` measures them (device-synchronised step times from a callback, warm-up
excluded; CUDA allocator peaks and NVML, or the CPU profiler probe over the last step),
so the rows compare like with like. Writes a metrics file whose last line is the same
{"summary": ...} as `trainwise train`; exit codes as the `trainwise` command."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from trainwise.engine.data.train_data import SyntheticMicroBatches
from trainwise.engine.flops import peak_flops_for
from trainwise.trace.flops import count_training_flops
from trainwise.engine.memory_probe import MemoryProbe
from trainwise.engine.metrics import MetricsLog, StepTimer
from trainwise.engine.runtime import runtime_device, synchronize
from trainwise.hardware import resolve_device
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.models.documents import attend_within_documents
from trainwise.models.attention import pick_attention
from trainwise.models.task_inputs import fit_task_sequence
from trainwise.plan import InputError, plan_from_sources
from trainwise.common.errors import OutOfMemory
from trainwise.techniques.activation_offload import enable_activation_offload
from trainwise.techniques.block_stacks import stacked_blocks
from trainwise.techniques.float8 import apply_float8, check_float8
from trainwise.techniques.kernels import apply_kernels, check_kernels
from trainwise.techniques.fused_loss_model import apply_fused_loss
from trainwise.techniques.lora import apply_lora

HF_OPTIMIZERS = {"adamw": "adamw_torch", "adamw-fused": "adamw_torch_fused", "adafactor": "adafactor",
                 "adamw-8bit": "adamw_bnb_8bit", "sgd": "sgd"}


class _SameSamples(torch.utils.data.Dataset):
    """Sample i is row i % b of trainwise's synthetic micro-batch i // b: the Trainer sees
    the very tokens `trainwise train --data synthetic` trains on, in the same order."""

    def __init__(self, micro_batches: SyntheticMicroBatches, batch_size: int, count: int):
        self.micro_batches, self.batch_size, self.length = micro_batches, batch_size, batch_size * count
        self._made: dict[int, dict] = {}  # each micro-batch is drawn once, as trainwise draws it

    def __len__(self):
        return self.length

    def __getitem__(self, index: int):
        number, row = divmod(index, self.batch_size)
        if number not in self._made:
            self._made[number] = self.micro_batches[number]
        return {key: value[row] for key, value in self._made[number].items()}


def training_arguments(plan, steps: int, seed: int, device_type: str, output_dir: str):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=plan.batch_size,
        gradient_accumulation_steps=plan.grad_accum, **_checkpointing(plan),
        fp16=plan.precision == "fp16", bf16=plan.precision == "bf16",
        tf32=True if plan.precision == "tf32" else None, optim=HF_OPTIMIZERS[plan.optim],
        max_steps=steps, learning_rate=plan.lr, warmup_steps=plan.warmup_steps,
        lr_scheduler_type=plan.lr_schedule if plan.lr_schedule != "constant" else "constant_with_warmup",
        weight_decay=plan.weight_decay, max_grad_norm=plan.max_grad_norm,
        dataloader_num_workers=plan.workers, dataloader_pin_memory=plan.pin_memory,
        torch_compile=plan.compile, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=device_type == "cpu", seed=seed, data_seed=seed, **_in_order(),
    )


def _in_order() -> dict:
    """The Trainer shuffles by default; the same batches in the same order need sequential
    sampling (an option of newer transformers; older ones draw the same samples shuffled)."""
    import dataclasses

    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"train_sampling_strategy": "sequential"} if "train_sampling_strategy" in fields else {}


def _checkpointing(plan) -> dict:
    """Per-layer checkpointing without reentrant autograd, as trainwise applies it. Newer
    transformers call it activation checkpointing (the old names are deprecated)."""
    import dataclasses

    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    by_trainer = plan.grad_ckpt and plan.grad_ckpt_policy == "full"  # selective: _selective_by_hand
    kwargs = {"use_reentrant": False, **({"every_n_layers": plan.grad_ckpt_every} if plan.grad_ckpt_every > 1 else {})}
    return {f"{prefix}_checkpointing": by_trainer, f"{prefix}_checkpointing_kwargs": kwargs if by_trainer else None}


def _selective_by_hand(model, plan) -> None:
    """Selective checkpointing as a Trainer user writes it: the policy is a function, which
    TrainingArguments cannot hold (they are serialised to JSON), so the model's own switch is
    called before the Trainer is built, with the same policy trainwise uses."""
    if plan.grad_ckpt and plan.grad_ckpt_policy == "selective":
        from trainwise.techniques.selective_checkpoint import checkpoint_kwargs

        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs("selective"),
                                              every_n_layers=plan.grad_ckpt_every)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf_trainer_worker")
    for flag in ("model", "--plan", "--data", "--metrics", "--task"):
        parser.add_argument(flag, default=None)
    for flag in ("--steps", "--timing-warmup", "--seed"):
        parser.add_argument(flag, type=int, default=0)
    args = parser.parse_args(argv)
    try:
        run(args)
    except InputError as err:
        print(f"trainwise: error: {err}", file=sys.stderr)
        return 2
    except (torch.OutOfMemoryError, OutOfMemory) as err:
        print(f"trainwise: error: out of memory: {str(err).splitlines()[0]}", file=sys.stderr)
        return 3
    return 0


def run(args) -> None:
    from transformers import Trainer

    plan = plan_from_sources(args.plan)
    device = runtime_device(plan.device)
    if plan.device == "cpu" and plan.precision in ("fp16", "tf32"):
        raise InputError("--precision", f"{plan.precision} needs a CUDA device")
    spec = resolve_model(args.model, task=args.task)
    plan, _ = fit_task_sequence(plan, spec)  # as trainwise's row: an image classifier's sequence is its patches
    if plan.attention == "auto":  # the pick trainwise's row makes, so both engines run one kernel
        plan = plan.replace(attention=pick_attention(resolve_device(_device_name(device)), spec, here=True,
                                                  precision=plan.precision)[0])
    # Kernels and float8 are applied to the Trainer's model the way trainwise applies them
    # (the Trainer has no float8 switch), so the row compares the engines on one plan.
    check_kernels(plan, resolve_device(_device_name(device)), spec, here=True)
    check_float8(plan, resolve_device(_device_name(device)), here=True)
    torch.manual_seed(args.seed)
    model = apply_kernels(build_model(spec, "cpu", attention=plan.attention), plan, spec.task)
    if plan.packing == "documents":
        attend_within_documents(model)  # what a Trainer user packing documents must do too
    if plan.lora:
        model = apply_lora(model, plan, spec.task)
    if plan.loss == "fused" and plan.kernels != "liger":  # the Trainer calls model(**batch): the same fused loss
        model = apply_fused_loss(model, spec.task)
    if plan.float8:
        model = apply_float8(model, plan)
    if plan.precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    _selective_by_hand(model, plan)
    if plan.activation_offload:  # the Trainer has no such switch: the same hooks, installed the same way
        enable_activation_offload(model, stacked_blocks(model))
    micro_batches = SyntheticMicroBatches(spec, plan.batch_size, plan.seq_len, args.seed, rank=0, world_size=1,
                                          documents=plan.packing == "documents")
    data = _SameSamples(micro_batches, plan.batch_size, args.steps * plan.grad_accum)
    measure = _Measure(device, plan, args, *_flops_and_peak(spec, plan, device))
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(model=model, args=training_arguments(plan, args.steps, args.seed, device.type, scratch),
                          train_dataset=data, callbacks=[measure])
        trainer.train()
    measure.finish()


def _flops_and_peak(spec, plan, device) -> tuple[int | None, float | None]:
    """Model FLOPs of one optimizer step and the device's peak FLOP/s, counted exactly as
    `trainwise train` counts them, so both engines' MFU use one yardstick. No peak (a
    CPU, a GPU missing from the catalog): no MFU, and the FLOPs are not counted at all."""
    peak, _ = peak_flops_for(resolve_device(_device_name(device)), plan.precision)
    if peak is None:
        return None, None
    meta = build_model(spec, "meta", attention=plan.attention)
    count = count_training_flops(meta, lambda: example_batch(spec, plan.batch_size, plan.seq_len, device="cpu",
                                                               documents=plan.packing == "documents"),
                                 plan, spec.task)
    return count.total * plan.grad_accum, peak


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _Measure(_callback_base()):
    """Times each optimizer step (device-synchronised) and probes memory like the engine."""

    def __init__(self, device, plan, args, flops_per_step: int | None, peak_flops: float | None):
        self.device, self.plan, self.args = device, plan, args
        tokens = plan.batch_size * plan.seq_len * plan.grad_accum
        self.timer = StepTimer(samples_per_step=plan.batch_size * plan.grad_accum, tokens_per_step=tokens,
                               flops_per_step=flops_per_step, peak_flops=peak_flops)
        self.probe = MemoryProbe(device, probe_step=args.steps - 1)
        self.log = MetricsLog(args.metrics)
        self.last_loss = None
        self._began: float | None = None
        # The run's time, like `trainwise train`'s: its steps, not building the Trainer.
        self._first_began: float | None = None
        self._last_end: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.probe.reset()

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        live = [*model.parameters(), *model.buffers()]
        if optimizer is not None:
            live += [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        self.probe.step_begin(state.global_step, live)
        if self._began is None:
            self._began = self._first_began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        # End to end, from the previous step's end: data loading and the Trainer's own
        # bookkeeping count, as they do for `trainwise train`.
        synchronize(self.device)
        now = time.perf_counter()
        elapsed, self._began, self._last_end = now - self._began, now, now
        step = state.global_step - 1
        self.probe.step_end(step)
        probed = self.device.type == "cpu" and step == self.probe.probe_step
        self.timer.record(elapsed, timed=step >= self.args.timing_warmup and not probed)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.last_loss = logs["loss"]
            self.log.step({"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate")})

    def finish(self) -> None:
        memory = self.probe.snapshot()
        total_s = (self._last_end - self._first_began) if self._first_began and self._last_end else 0.0
        self.log.summary({**self.timer.summary(total_s), "peak_allocated": memory.peak_allocated,
                          "peak_reserved": memory.peak_reserved, "device_total": memory.device_total,
                          "final_loss": self.last_loss, "memory_method": memory.method})


def _device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


if __name__ == "__main__":
    sys.exit(main())
