"""A chosen plan written for another launcher: Transformers TrainingArguments (JSON), an
accelerate config (YAML), a DeepSpeed config (JSON), a torchrun script, a Slurm batch
script (both running `trainwise train`), or a torchtitan job config (TOML). Each target
carries what the user gave `plan` (model, data, output...) where its format holds it, keeps
the plan's global batch when it drops a kind of parallelism, and names every knob it cannot
express (returned, and as comments in the formats that have them), so nothing is dropped
silently."""

from __future__ import annotations

import json

import yaml

from trainwise.plan.plan import Plan
from trainwise.emit.batch import BatchShape, batch_shape
from trainwise.emit.train_line import RDZV_PORT, Launch, node_shape, world_size

TARGETS = ("trainer", "accelerate", "deepspeed", "torchrun", "slurm", "torchtitan")
# How the Trainer spells trainwise's optimizers (TrainingArguments.optim).
TRAINER_OPTIM = {"adamw": "adamw_torch", "adamw-fused": "adamw_torch_fused", "adafactor": "adafactor",
                 "adamw-8bit": "adamw_bnb_8bit", "sgd": "sgd"}
TRAINER_SCHEDULE = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def emit(plan: Plan, target: str, launch: Launch | str) -> tuple[str, list[str]]:
    """(the text for `target`, the knobs of `plan` it cannot express, one phrase each).
    InputError when `target` cannot train `plan` at all (the reason in one line)."""
    from trainwise.emit.cluster import slurm_script, torchrun_script
    from trainwise.emit.torchtitan import torchtitan_config

    launch = launch if isinstance(launch, Launch) else Launch(launch)
    writer = {"trainer": trainer_arguments, "accelerate": accelerate_config, "deepspeed": deepspeed_config,
              "torchrun": torchrun_script, "slurm": slurm_script, "torchtitan": torchtitan_config}[target]
    return writer(plan, launch)


def comments(lines: list[str]) -> str:
    """`lines` as `# ` comment lines (for shell, YAML and TOML files)."""
    return "".join(f"# {line}\n" for line in lines)


def cannot_express_comments(missing: list[str]) -> str:
    return comments(["cannot express here (do it by hand):", *(f"- {m}" for m in missing)] if missing
                    else ["every knob of the plan is expressed"])


def _script_side(launch: Launch, what: str) -> list[str]:
    """What a config file cannot hold of what the user gave `plan`: the model and data load in
    the user's script."""
    given = [f"model {launch.model}"] + [f"{name} {value}" for name, value in
                                         (("data", launch.data), ("tokenizer", launch.tokenizer),
                                          ("task", launch.task)) if value]
    return [f"{', '.join(given)}: {what} holds no model or data; load them in your training script"]


def _launch_note(plan: Plan, launch: Launch, runner: str) -> list[str]:
    """How to start a script on every node when the plan spans several."""
    nodes, per_node = node_shape(plan, launch)
    if nodes == 1:
        return []
    return [f"{nodes} nodes x {per_node} GPUs: {runner}"]


def _model_side(plan: Plan) -> list[str]:
    """Knobs that live on the model or the data, not in any launcher's config."""
    missing = [f"attention {plan.attention}: pass attn_implementation={plan.attention!r} to from_pretrained",
               f"seq_len {plan.seq_len}: set the tokenizer's max_length / packing to {plan.seq_len} tokens"]
    if plan.lora:
        missing.append(f"LoRA rank {plan.lora_rank}: wrap the model with a peft LoraConfig(r={plan.lora_rank}, "
                       f"lora_alpha={plan.lora_alpha})")
    if plan.precision == "bf16-pure":
        missing.append("bf16-pure: load the model with torch_dtype=torch.bfloat16 (no fp32 master weights)")
    return missing + _engine_techniques(plan)


def _engine_techniques(plan: Plan) -> list[str]:
    """The engine techniques no launcher config holds: what to do by hand for each."""
    missing = []
    if plan.loss == "fused" and plan.kernels != "liger":
        missing.append("fused loss: no launcher setting; liger-kernel's fused linear cross-entropy does the same "
                       "(use_liger_kernel=True in the Trainer)")
    if plan.kernels == "liger":
        missing.append("liger kernels: apply_liger_kernel_to_<family>(model=model) from liger_kernel.transformers "
                       "(the Trainer: use_liger_kernel=True)")
    if plan.float8:
        missing.append("float8: torchao.float8.convert_to_float8_training(model) before torch.compile")
    if plan.grad_ckpt and plan.grad_ckpt_policy == "selective":
        missing.append("selective checkpointing: gradient_checkpointing_kwargs={'use_reentrant': False, "
                       "'context_fn': a torch.utils.checkpoint.create_selective_checkpoint_contexts policy}")
    if plan.grad_ckpt and plan.grad_ckpt_every > 1:
        missing.append(f"checkpointing every {plan.grad_ckpt_every} blocks: set gradient_checkpointing=False on "
                       "the other decoder layers after enabling it")
    if plan.activation_offload:
        missing.append("activation offload: run forward under torch.autograd.graph.save_on_cpu(pin_memory=True)")
    if plan.packing == "documents":
        missing.append("packing documents: per-document position_ids and no attention_mask "
                       "(DataCollatorWithFlattening), use_cache=False")
    if plan.compile and plan.compile_scope == "blocks":
        missing.append("compile per block: call .compile() on each decoder layer instead of torch_compile")
    return missing


def _parallel_missing(plan: Plan, target: str) -> list[str]:
    missing = []
    if plan.tp > 1:
        missing.append(f"tensor parallel {plan.tp}" + (" with sequence parallel" if plan.sequence_parallel else "")
                       + f": {target} has no tensor parallel here")
    if plan.pp > 1:
        missing.append(f"pipeline parallel {plan.pp} ({plan.pp_schedule}): {target} has no pipeline parallel here")
    return missing


def _dropped(plan: Plan, target: str) -> tuple[BatchShape, list[str]]:
    """The batch shape without tensor and pipeline parallel, and the lines naming both."""
    shape = batch_shape(plan, target, keeps_tp=False, keeps_pp=False)
    return shape, _parallel_missing(plan, target) + ([shape.note] if shape.note else [])


def trainer_arguments(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """TrainingArguments keyword arguments as JSON."""
    shape, parallel = _dropped(plan, "the Trainer")
    args = {"per_device_train_batch_size": shape.micro, "gradient_accumulation_steps": shape.accum,
            "learning_rate": plan.lr, "weight_decay": plan.weight_decay, "warmup_steps": plan.warmup_steps,
            "lr_scheduler_type": TRAINER_SCHEDULE[plan.lr_schedule], "max_grad_norm": plan.max_grad_norm,
            "optim": TRAINER_OPTIM[plan.optim], "bf16": plan.precision == "bf16", "fp16": plan.precision == "fp16",
            "tf32": plan.precision == "tf32", "gradient_checkpointing": plan.grad_ckpt,
            "torch_compile": plan.compile, "dataloader_num_workers": plan.workers,
            "dataloader_pin_memory": plan.pin_memory}
    args.update({key: value for key, value in (("output_dir", launch.output), ("max_steps", launch.steps),
                                                ("save_steps", launch.save_every)) if value is not None})
    if plan.compile:
        args["torch_compile_mode"] = plan.compile_mode
    if plan.kernels == "liger":
        args["use_liger_kernel"] = True
    if plan.zero in (2, 3):
        args["fsdp"] = ("full_shard" if plan.zero == 3 else "shard_grad_op") + (" offload" if plan.cpu_offload else "")
    elif plan.zero == 1:
        args["deepspeed"] = json.loads(deepspeed_config(plan, launch)[0])
    launch_note = _launch_note(plan, launch, "start your script with the `torchrun` target's command on each node")
    return (json.dumps(args, indent=2),
            _script_side(launch, "TrainingArguments") + _model_side(plan) + parallel + launch_note)


def accelerate_config(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """An `accelerate launch --config_file` YAML: every node runs it with its own machine_rank."""
    shape, parallel = _dropped(plan, "accelerate")
    nodes, _ = node_shape(plan, launch)
    processes = world_size(plan)
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no")
    config = {"compute_environment": "LOCAL_MACHINE", "machine_rank": 0, "num_machines": nodes,
              "num_processes": processes, "mixed_precision": mixed,
              "distributed_type": "NO" if processes == 1 else "MULTI_GPU"}
    if nodes > 1:
        config.update(main_process_ip="HEAD_NODE", main_process_port=RDZV_PORT, rdzv_backend="static",
                      same_network=True)
    if plan.zero in (2, 3):
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {"fsdp_sharding_strategy": "FULL_SHARD" if plan.zero == 3 else "SHARD_GRAD_OP",
                                 "fsdp_offload_params": plan.cpu_offload,
                                 "fsdp_activation_checkpointing": plan.grad_ckpt}
    elif plan.zero == 1:
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {"zero_stage": 1, "gradient_accumulation_steps": shape.accum}
    if plan.compile:
        config["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_mode": plan.compile_mode}
    missing = [f"micro-batch {shape.micro}: set the DataLoader's batch_size",
               f"accumulation {shape.accum}: Accelerator(gradient_accumulation_steps={shape.accum})",
               f"optimizer {plan.optim} (lr {plan.lr}, weight decay {plan.weight_decay}): built in your script"]
    if plan.grad_ckpt and plan.zero not in (2, 3):
        missing.append("grad checkpointing: model.gradient_checkpointing_enable()")
    if plan.precision == "tf32":
        missing.append("tf32: torch.backends.cuda.matmul.allow_tf32 = True")
    missing += (_script_side(launch, "an accelerate config") + _model_side(plan) + parallel
                + _launch_note(plan, launch, "on node r run `accelerate launch --config_file FILE --machine_rank r "
                                             "--main_process_ip ADDRESS your_script.py` (ADDRESS: node 0's; or "
                                             "edit machine_rank and HEAD_NODE in the file)"))
    header = cannot_express_comments(missing)
    return header + yaml.safe_dump(config, sort_keys=False), missing


def deepspeed_config(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """A DeepSpeed config (JSON); plain data parallel is ZeRO stage 0."""
    shape, parallel = _dropped(plan, "DeepSpeed")
    zero = {"stage": plan.zero or 0}
    if plan.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if plan.zero == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {"train_micro_batch_size_per_gpu": shape.micro, "gradient_accumulation_steps": shape.accum,
              "train_batch_size": shape.global_batch,
              "gradient_clipping": plan.max_grad_norm, "bf16": {"enabled": plan.precision in ("bf16", "bf16-pure")},
              "fp16": {"enabled": plan.precision == "fp16"}, "zero_optimization": zero}
    if plan.optim in ("adamw", "adamw-fused"):
        config["optimizer"] = {"type": "AdamW", "params": {"lr": plan.lr, "weight_decay": plan.weight_decay}}
    missing = [f"learning-rate schedule {plan.lr_schedule} with {plan.warmup_steps} warm-up steps: give DeepSpeed "
               "a scheduler with your run's total steps"]
    if plan.optim not in ("adamw", "adamw-fused"):
        missing.append(f"optimizer {plan.optim}: build it in your script and pass it to deepspeed.initialize")
    if plan.grad_ckpt:
        missing.append("grad checkpointing: model.gradient_checkpointing_enable()")
    if plan.compile:
        missing.append("compile: torch.compile the engine's module in your script")
    nodes, per_node = node_shape(plan, launch)
    hostfile = _launch_note(plan, launch, f"write a hostfile of {nodes} lines `HOSTNAME slots={per_node}` and run "
                                          f"`deepspeed --hostfile hostfile --num_nodes {nodes} --num_gpus {per_node} "
                                          "your_script.py --deepspeed FILE` on the first node")
    return (json.dumps(config, indent=2),
            missing + _script_side(launch, "a DeepSpeed config") + _model_side(plan) + parallel + hostfile)
