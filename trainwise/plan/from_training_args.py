"""A Transformers TrainingArguments JSON (as `TrainingArguments.to_json_string()` writes it)
read into Plan knobs.

Every setting that changes one step's memory or time is mapped exactly, mapped
approximately with the reason, or refused; a setting trainwise does not model is listed as
ignored when its value differs from the Trainer's default. An optimizer or sharding mode
with no equivalent is refused rather than replaced: its memory would be a different one."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainwise.plan.foreign_reading import Reading, positive_int, truthy
from trainwise.plan.from_deepspeed import read_deepspeed

# TrainingArguments.optim -> (trainwise optimizer, note when the mapping is approximate).
OPTIMIZERS = {
    "adamw_torch": ("adamw", ""),
    "adamw_torch_fused": ("adamw-fused", ""),
    "adafactor": ("adafactor", ""),
    "sgd": ("sgd", ""),
    "adamw_bnb_8bit": ("adamw-8bit", ""),
    "adamw_8bit": ("adamw-8bit", ""),
    "adamw_torch_8bit": ("adamw-8bit", "torchao's 8-bit AdamW read as bitsandbytes' (2 bytes of state per parameter "
                                       "in both)"),
    "paged_adamw_8bit": ("adamw-8bit", "paged: bitsandbytes may move the state to host memory under pressure; "
                                       "predicted as held on the device"),
    "paged_adamw_32bit": ("adamw", "paged: bitsandbytes may move the state to host memory under pressure; "
                                   "predicted as held on the device"),
}
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
MAPPED = {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "tf32", "learning_rate",
          "weight_decay", "warmup_steps", "lr_scheduler_type", "max_grad_norm", "gradient_checkpointing",
          "activation_checkpointing", "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs", "optim",
          "torch_compile", "torch_compile_mode", "torch_compile_backend", "dataloader_num_workers",
          "dataloader_pin_memory", "fsdp", "fsdp_config", "deepspeed", "max_steps"}
# Settings that change neither one training step's memory nor its time.
NO_EFFECT_PREFIXES = ("output_", "logging_", "log_", "save_", "eval_", "hub_", "push_to_hub", "report_to", "run_name",
                      "seed", "data_seed", "do_", "num_train_epochs", "resume_", "metric_for", "greater_is",
                      "load_best", "label_names", "per_device_eval", "prediction_", "disable_tqdm", "project",
                      "trackio_", "local_rank", "include_", "batch_eval", "restore_callback", "skip_memory",
                      "full_determinism", "ignore_data_skip", "adam_", "lr_scheduler_kwargs", "ddp_timeout",
                      "debug", "remove_unused", "length_column", "use_cpu", "dataloader_drop_last",
                      "dataloader_in_order", "dataloader_persistent", "dataloader_prefetch", "dataloader_multiproc",
                      "average_tokens", "accelerator_config", "fp16_full_eval", "bf16_full_eval", "train_sampling")


def read_training_args(args: dict, source: str) -> Reading:
    """The knobs a TrainingArguments JSON gives (InputError for a setting with no equivalent)."""
    reading = Reading(source=source, kind="training-args")
    _batch_and_schedule(reading, args)
    _precision(reading, args)
    _techniques(reading, args)
    _sharding(reading, args)
    for key in sorted(_unmodelled(args)):
        reading.ignored(key, args[key], "not modelled by trainwise (differs from the Trainer's default)")
    return reading


def deepspeed_reading(args: dict, source: str, load) -> Reading | None:
    """The DeepSpeed config a TrainingArguments names (a file path, read with `load`, or an
    inline mapping), its "auto" entries taken from the TrainingArguments."""
    entry = args.get("deepspeed")
    if not entry:
        return None
    config, where = (entry, f"{source} (deepspeed)") if isinstance(entry, dict) else (load(entry), str(entry))
    auto = {"batch_size": args.get("per_device_train_batch_size"), "grad_accum": args.get("gradient_accumulation_steps")}
    return read_deepspeed(config, where, auto)


def _batch_and_schedule(reading: Reading, args: dict) -> None:
    for key, knob in (("per_device_train_batch_size", "batch_size"), ("gradient_accumulation_steps", "grad_accum")):
        if key in args:
            reading.exact(key, args[key], knob, positive_int(reading, key, args[key]))
    for key, knob in (("learning_rate", "lr"), ("weight_decay", "weight_decay"), ("max_grad_norm", "max_grad_norm")):
        if args.get(key) is not None:
            reading.exact(key, args[key], knob, float(args[key]))
    warmup = args.get("warmup_steps") or 0
    if 0 < warmup < 1:  # a fraction of the run, as TrainingArguments reads values below 1
        steps = args.get("max_steps", -1)
        if steps and steps > 0:
            reading.approximate("warmup_steps", warmup, "warmup_steps", math.ceil(warmup * steps),
                                f"a fraction of max_steps {steps}, rounded up")
        else:
            reading.ignored("warmup_steps", warmup, "a fraction of a run whose length (epochs) is not known here; "
                                                    "no effect on one step's memory or time")
    elif warmup:
        reading.exact("warmup_steps", warmup, "warmup_steps", positive_int(reading, "warmup_steps", warmup))
    schedule = args.get("lr_scheduler_type")
    if schedule is not None:
        mapped = SCHEDULES.get(schedule)
        if mapped == schedule:
            reading.exact("lr_scheduler_type", schedule, "lr_schedule", mapped)
        else:
            reading.approximate("lr_scheduler_type", schedule, "lr_schedule", mapped or "cosine",
                                "nearest trainwise schedule; the schedule changes neither memory nor step time")


def _precision(reading: Reading, args: dict) -> None:
    if truthy(args.get("bf16")):
        reading.exact("bf16", args["bf16"], "precision", "bf16")
    elif truthy(args.get("fp16")):
        reading.exact("fp16", args["fp16"], "precision", "fp16")
    elif truthy(args.get("tf32")):
        reading.exact("tf32", args["tf32"], "precision", "tf32")


def _techniques(reading: Reading, args: dict) -> None:
    # transformers 5 writes both names (activation_checkpointing is the new one): read one.
    key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if truthy(args.get(k))), None)
    if key:
        reading.exact(key, args[key], "grad_ckpt", True)
        kwargs = args.get(key + "_kwargs") or {}
        if kwargs.get("use_reentrant", False):
            reading.approximate(key + "_kwargs", kwargs, "grad_ckpt", True,
                                "trainwise checkpoints without reentrant autograd (the same saved tensors)")
    optim = args.get("optim")
    if optim is not None:
        if optim not in OPTIMIZERS:
            raise reading.refuse("optim", optim, "has no trainwise equivalent; supported: " + ", ".join(OPTIMIZERS))
        name, note = OPTIMIZERS[optim]
        (reading.approximate("optim", optim, "optim", name, note) if note
         else reading.exact("optim", optim, "optim", name))
    if truthy(args.get("torch_compile")):
        backend = args.get("torch_compile_backend") or "inductor"
        if backend == "inductor":
            reading.exact("torch_compile", True, "compile", True)
        else:
            reading.approximate("torch_compile_backend", backend, "compile", True, "trainwise compiles with inductor")
        mode = args.get("torch_compile_mode")
        if mode in ("default", "reduce-overhead", "max-autotune"):
            reading.exact("torch_compile_mode", mode, "compile_mode", mode)
    if args.get("dataloader_num_workers"):
        reading.exact("dataloader_num_workers", args["dataloader_num_workers"], "workers",
                      int(args["dataloader_num_workers"]))
    if "dataloader_pin_memory" in args:
        reading.exact("dataloader_pin_memory", args["dataloader_pin_memory"], "pin_memory",
                      truthy(args["dataloader_pin_memory"]))


def _sharding(reading: Reading, args: dict) -> None:
    """TrainingArguments' FSDP: `fsdp: true` with its fsdp_config (what transformers 5 writes),
    or the older option list / space-separated string ("full_shard auto_wrap offload")."""
    entry, config = args.get("fsdp"), args.get("fsdp_config") or {}
    if not entry:
        return
    if entry is True or entry == "true":
        reshard = config.get("reshard_after_forward", True)
        stage, offload = (3 if truthy(reshard) else 2), truthy(config.get("cpu_offload"))
        key = "fsdp_config.reshard_after_forward"
    else:
        options = entry.split() if isinstance(entry, str) else [str(o) for o in entry]
        if any(o.startswith("hybrid_shard") for o in options):
            raise reading.refuse("fsdp", " ".join(options), "(hybrid sharding) is not read from TrainingArguments: "
                                                            "give the layout as --dp NODES --fsdp GPUS_PER_NODE")
        if "no_shard" in options:
            reading.spread("replicate", "fsdp")
            return
        if "full_shard" not in options and "shard_grad_op" not in options:
            raise reading.refuse("fsdp", " ".join(options), "must name full_shard, shard_grad_op or no_shard")
        stage, offload, key = (3 if "full_shard" in options else 2), "offload" in options, "fsdp"
    reading.exact(key, entry if key == "fsdp" else config.get("reshard_after_forward", True), "zero", stage)
    reading.spread("shard", key)
    if offload:
        reading.exact("fsdp_config.cpu_offload" if key != "fsdp" else "fsdp offload", True, "cpu_offload", True)
    if truthy(config.get("activation_checkpointing")):
        reading.exact("fsdp_config.activation_checkpointing", True, "grad_ckpt", True)
    tuned = sorted(set(config) - {"reshard_after_forward", "cpu_offload", "activation_checkpointing", "min_num_params",
                                  "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"})
    if tuned:
        reading.approximate("fsdp_config." + ",".join(tuned), {k: config[k] for k in tuned}, "zero", stage,
                            "trainwise wraps each transformer block with FSDP2 and prefetches as its own settings "
                            "say, whatever these name")


def _unmodelled(args: dict) -> list[str]:
    """Keys not mapped above whose value differs from the Trainer's default."""
    defaults = _trainer_defaults()
    keys = []
    for key, value in args.items():
        if key in MAPPED or key.startswith(NO_EFFECT_PREFIXES):
            continue
        if key in defaults and defaults[key] == value:
            continue
        if value in (None, False, [], {}, "") and defaults.get(key, value) in (None, False, [], {}, ""):
            continue
        keys.append(key)
    return keys


def _as_json(value: Any) -> Any:
    """A default as to_json_string() writes it (dataclass configs become mappings)."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def _trainer_defaults() -> dict[str, Any]:
    from transformers import TrainingArguments  # deferred: only this reader needs transformers here

    defaults = {}
    for item in dataclasses.fields(TrainingArguments):
        if item.default is not dataclasses.MISSING:
            defaults[item.name] = item.default
        elif item.default_factory is not dataclasses.MISSING:
            defaults[item.name] = _as_json(item.default_factory())
    return defaults
