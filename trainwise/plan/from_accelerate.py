"""An accelerate config (the YAML `accelerate config` writes) read into Plan knobs.

It says how a run is spread over GPUs and in which precision; the batch and the optimizer
come from TrainingArguments, a DeepSpeed config or the flags."""

from __future__ import annotations

from typing import Any

from trainwise.plan.foreign_reading import Reading, positive_int, truthy
from trainwise.plan.from_deepspeed import read_deepspeed

# fsdp_sharding_strategy, by name or by FSDP1's enum number -> ZeRO stage (None: no sharding).
SHARDING = {"FULL_SHARD": 3, "1": 3, "SHARD_GRAD_OP": 2, "2": 2, "NO_SHARD": None, "3": None,
            "HYBRID_SHARD": "hybrid", "4": "hybrid", "HYBRID_SHARD_ZERO2": "hybrid", "5": "hybrid"}
PRECISION = {"no": None, "fp16": "fp16", "bf16": "bf16"}
SUPPORTED_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM")


def read_accelerate(config: dict, source: str, load) -> Reading | list[Reading]:
    """The knobs `config` gives (with the DeepSpeed file it names, read with `load`, as a
    second Reading)."""
    reading = Reading(source=source, kind="accelerate")
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind not in SUPPORTED_TYPES:
        raise reading.refuse("distributed_type", config.get("distributed_type"),
                             "is not a GPU layout trainwise estimates; supported: " + ", ".join(SUPPORTED_TYPES))
    _launch(reading, config)
    _precision(reading, config.get("mixed_precision"))
    dynamo = config.get("dynamo_config") or {}
    backend = str(dynamo.get("dynamo_backend", "NO")).upper()
    if backend not in ("NO", ""):
        how = reading.exact if backend == "INDUCTOR" else reading.approximate
        args = () if backend == "INDUCTOR" else ("trainwise compiles with inductor",)
        how("dynamo_config.dynamo_backend", dynamo["dynamo_backend"], "compile", True, *args)
    extra = []
    if kind == "MULTI_GPU":
        reading.spread("replicate", "distributed_type")
    elif kind == "FSDP":
        _fsdp(reading, config.get("fsdp_config") or {})
    elif kind == "MEGATRON_LM":
        _megatron(reading, config.get("megatron_lm_config") or {})
    elif kind == "DEEPSPEED":
        extra = _deepspeed(reading, config.get("deepspeed_config") or {}, load)
    return [reading, *extra] if extra else reading


def _launch(reading: Reading, config: dict) -> None:
    processes = config.get("num_processes")
    machines = config.get("num_machines", 1)
    if processes is None:
        return
    processes = positive_int(reading, "num_processes", processes)
    machines = positive_int(reading, "num_machines", machines)
    if processes % machines:
        raise reading.refuse("num_processes", processes, f"must be a multiple of num_machines ({machines})")
    reading.world_size = processes
    reading.gpus_per_node = processes // machines


def _precision(reading: Reading, value: Any) -> None:
    if value is None:
        return
    name = str(value).lower()
    if name == "fp8":
        raise reading.refuse("mixed_precision", value, "is not estimated by trainwise; use bf16 or fp16")
    if name not in PRECISION:
        raise reading.refuse("mixed_precision", value, "must be no, fp16 or bf16")
    if PRECISION[name]:
        reading.exact("mixed_precision", value, "precision", PRECISION[name])


def _fsdp(reading: Reading, fsdp: dict) -> None:
    strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
    if fsdp.get("fsdp_reshard_after_forward") is not None and "fsdp_sharding_strategy" not in fsdp:
        # FSDP2 configs say whether parameters are gathered again for backward instead.
        strategy = "FULL_SHARD" if truthy(fsdp["fsdp_reshard_after_forward"]) else "SHARD_GRAD_OP"
    stage = SHARDING.get(strategy, "unknown")
    if stage == "unknown":
        raise reading.refuse("fsdp_config.fsdp_sharding_strategy", strategy, "must be FULL_SHARD, SHARD_GRAD_OP or "
                                                                           "NO_SHARD")
    if stage == "hybrid":
        raise reading.refuse("fsdp_config.fsdp_sharding_strategy", strategy, "(hybrid sharding) is not read from "
                             "accelerate configs: give the layout as --dp NODES --fsdp GPUS_PER_NODE")
    if stage is None:
        reading.spread("replicate", "fsdp_config.fsdp_sharding_strategy")
        return
    reading.exact("fsdp_config.fsdp_sharding_strategy", strategy, "zero", stage)
    reading.spread("shard", "fsdp_config.fsdp_sharding_strategy")
    if truthy(fsdp.get("fsdp_offload_params")):
        reading.exact("fsdp_config.fsdp_offload_params", True, "cpu_offload", True)
    if truthy(fsdp.get("fsdp_activation_checkpointing")):
        reading.exact("fsdp_config.fsdp_activation_checkpointing", True, "grad_ckpt", True)


def _megatron(reading: Reading, megatron: dict) -> None:
    for key, knob in (("megatron_lm_tp_degree", "tp"), ("megatron_lm_pp_degree", "pp")):
        if key in megatron:
            reading.exact(f"megatron_lm_config.{key}", megatron[key], knob, positive_int(reading, key, megatron[key]))
    if truthy(megatron.get("megatron_lm_sequence_parallelism")):
        reading.exact("megatron_lm_config.megatron_lm_sequence_parallelism", True, "sequence_parallel", True)
    reading.approximate("distributed_type", "MEGATRON_LM", "tp", reading.values.get("tp", 1),
                        "Megatron-LM's own model code is not run: trainwise splits the Hugging Face model with "
                        "PyTorch tensor and pipeline parallel at the same degrees")


def _deepspeed(reading: Reading, deepspeed: dict, load) -> list[Reading]:
    if deepspeed.get("deepspeed_config_file"):
        path = deepspeed["deepspeed_config_file"]
        return [read_deepspeed(load(path), str(path))]
    config = {"zero_optimization": {"stage": deepspeed.get("zero_stage", 0)}}
    for part in ("optimizer", "param"):
        device = deepspeed.get(f"offload_{part}_device")
        if device:
            config["zero_optimization"][f"offload_{part}"] = {"device": device}
    for key in ("gradient_accumulation_steps", "gradient_clipping"):
        if deepspeed.get(key) is not None:
            config[key] = deepspeed[key]
    return [read_deepspeed(config, f"{reading.source} (deepspeed_config)")]
