"""A DeepSpeed config (the JSON given to `deepspeed.initialize`, or TrainingArguments'
`deepspeed` entry) read into Plan knobs.

ZeRO stages map to trainwise's FSDP2 sharding of the same states (1: optimizer state,
2: + gradients, 3: + parameters); "auto" values are the ones the Trainer fills in from its
TrainingArguments, so they are read from there when the file came with them."""

from __future__ import annotations

from typing import Any

from trainwise.plan.foreign_reading import Reading, positive_int, truthy

# Settings that change neither one step's memory nor its time (logging, scheduling, I/O).
NO_EFFECT = {"scheduler", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
             "prescale_gradients", "gradient_predivide_factor", "dump_state", "tensorboard", "wandb",
             "csv_monitor", "comms_logger", "flops_profiler", "checkpoint", "data_types", "seed"}
ZERO_NO_EFFECT = {"stage", "offload_optimizer", "offload_param", "round_robin_gradients",
                  "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                  "ignore_unused_parameters", "sub_group_size"}
ADAM_TYPES = {"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"}


def read_deepspeed(config: dict, source: str, auto: dict[str, Any] | None = None) -> Reading:
    """The knobs `config` gives. `auto`: the knob values "auto" entries stand for (from the
    TrainingArguments the config came with); without them an "auto" entry is left to the
    other sources and flags."""
    reading = Reading(source=source, kind="deepspeed")
    auto = auto or {}
    _batch(reading, config, auto)
    _precision(reading, config)
    _zero(reading, config.get("zero_optimization") or {})
    _optimizer(reading, config.get("optimizer"))
    clip = config.get("gradient_clipping")
    if clip is not None and clip != "auto":
        reading.exact("gradient_clipping", clip, "max_grad_norm", float(clip))
    if config.get("activation_checkpointing"):
        reading.ignored("activation_checkpointing", config["activation_checkpointing"],
                        "DeepSpeed's own checkpointing API is used only by models written for it; a Hugging Face "
                        "model checkpoints through gradient_checkpointing (TrainingArguments) or --grad-ckpt")
    for key in sorted(set(config) - NO_EFFECT - {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                                 "train_batch_size", "fp16", "bf16", "zero_optimization",
                                                 "optimizer", "gradient_clipping", "activation_checkpointing"}):
        reading.ignored(key, config[key], "not modelled by trainwise")
    return reading


def _batch(reading: Reading, config: dict, auto: dict) -> None:
    values = {}
    for key, knob in (("train_micro_batch_size_per_gpu", "batch_size"), ("gradient_accumulation_steps", "grad_accum")):
        value = config.get(key)
        if value == "auto":
            value = auto.get(knob)
        if value is not None:
            values[knob] = positive_int(reading, key, value)
            reading.exact(key, config[key], knob, values[knob])
    total = config.get("train_batch_size")
    if total not in (None, "auto") and len(values) == 2:
        total = positive_int(reading, "train_batch_size", total)
        per_replica = values["batch_size"] * values["grad_accum"]
        if total % per_replica:
            raise reading.refuse("train_batch_size", total, f"must be a multiple of micro-batch x accumulation "
                                                             f"= {per_replica}")
        reading.world_size = total // per_replica


def _precision(reading: Reading, config: dict) -> None:
    bf16 = config.get("bf16") or config.get("bfloat16") or {}
    fp16 = config.get("fp16") or {}
    if truthy(bf16.get("enabled")):
        reading.approximate("bf16.enabled", bf16["enabled"], "precision", "bf16",
                            "DeepSpeed holds bf16 weights and gradients with fp32 master weights in the optimizer; "
                            "trainwise's bf16 keeps fp32 weights and autocasts: the same 16 bytes of model state per "
                            "parameter with Adam, activations as autocast makes them")
    elif truthy(fp16.get("enabled")):
        reading.approximate("fp16.enabled", fp16["enabled"], "precision", "fp16",
                            "DeepSpeed holds fp16 weights with fp32 master weights; trainwise keeps fp32 weights and "
                            "autocasts, with the same dynamic loss scaling")
    elif bf16.get("enabled") == "auto" or fp16.get("enabled") == "auto":
        reading.ignored("fp16/bf16.enabled", "auto", "left to TrainingArguments' bf16/fp16 or --precision")


def _zero(reading: Reading, zero: dict) -> None:
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise reading.refuse("zero_optimization.stage", stage, "must be 0, 1, 2 or 3")
    offload = {part: (zero.get(f"offload_{part}") or {}).get("device", "none") for part in ("optimizer", "param")}
    for part, device in offload.items():
        if device not in ("none", "cpu", None):
            raise reading.refuse(f"zero_optimization.offload_{part}.device", device,
                                 "is not supported: trainwise offloads to host memory only (cpu or none)")
    if stage == 0:
        reading.spread("replicate", "zero_optimization.stage")  # DeepSpeed without ZeRO: plain data parallel
        return
    reading.exact("zero_optimization.stage", stage, "zero", stage)
    reading.spread("shard", "zero_optimization.stage")
    if "cpu" in offload.values():
        both = all(device == "cpu" for device in offload.values())
        note = "" if both else ("trainwise offloads the sharded parameters and the optimizer state together "
                                "(FSDP2 CPU offload), more than this config moves")
        key = "zero_optimization.offload_" + ("param" if offload["param"] == "cpu" else "optimizer")
        (reading.exact(key, "cpu", "cpu_offload", True) if both
         else reading.approximate(key, "cpu", "cpu_offload", True, note))
    tuned = sorted(set(zero) - ZERO_NO_EFFECT)
    if tuned:
        reading.approximate("zero_optimization." + ",".join(tuned), {k: zero[k] for k in tuned}, "zero", stage,
                            "communication buckets, prefetch and persistence follow trainwise's FSDP2 settings, "
                            "not these")


def _optimizer(reading: Reading, optimizer: Any) -> None:
    if not optimizer:
        return
    name = str(optimizer.get("type", "")).replace("_", "").lower()
    if name not in ADAM_TYPES:
        raise reading.refuse("optimizer.type", optimizer.get("type"),
                             "has no trainwise equivalent; supported: Adam, AdamW (or an optimizer in TrainingArguments)")
    reading.approximate("optimizer.type", optimizer["type"], "optim", "adamw",
                        "DeepSpeed runs its own fused Adam; trainwise's AdamW holds the same two fp32 states per "
                        "parameter")
