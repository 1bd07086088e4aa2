"""A Llama 3 plan as a torchtitan job config (TOML), for torchtitan v0.2.2 (February 2026):
the section and key names of its `torchtitan/config/job_config.py` at that tag, its llama3
flavors (8B, 70B, 405B) and its converter name for float8 (`quantize.linear.float8`).
torchtitan keeps tensor and pipeline parallel, so the plan's batch shape is kept as is:
`local_batch_size` is the micro-batch, `global_batch_size` micro x accumulation x
data-parallel degree (torchtitan derives the accumulation from the two)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainwise.common.errors import InputError
from trainwise.engine.run_config import RunConfig
from trainwise.plan.partition import pipeline_microbatches
from trainwise.plan.plan import Plan
from trainwise.emit.targets import cannot_express_comments, comments
from trainwise.emit.batch import global_batch
from trainwise.emit.train_line import Launch, local_path, node_shape

RELEASE = "v0.2.2"
FLAVORS = ("8B", "70B", "405B")
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def flavor_of(model: str) -> str:
    """torchtitan's llama3 flavor of a Llama 3 / 3.1 model name or directory (its last part);
    InputError for any other model."""
    name = Path(model.rstrip("/")).name
    found = re.fullmatch(r"(?:meta-)?llama-3(?:\.\d)?-(\d+b)(?:-instruct)?", name, re.IGNORECASE)
    if found is None or found.group(1).upper() not in FLAVORS:
        raise InputError("--emit", f"torchtitan ({RELEASE}) trains its own llama3 model of flavors "
                                   f"{', '.join(FLAVORS)}; {model} is none of them (use --emit torchrun or slurm)")
    return found.group(1).upper()


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string escapes as JSON does


def toml_text(sections: dict[str, dict]) -> str:
    return "\n".join(f"[{name}]\n" + "".join(f"{key} = {toml_value(v)}\n" for key, v in values.items())
                     for name, values in sections.items())


def _parallelism(plan: Plan) -> tuple[dict, list[str]]:
    values = {"data_parallel_replicate_degree": plan.dp, "data_parallel_shard_degree": plan.fsdp,
              "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
              "fsdp_reshard_after_forward": {2: "never", 3: "always"}.get(plan.zero, "default")}
    missing = []
    if plan.pp > 1:
        values["pipeline_parallel_schedule"] = SCHEDULES[plan.pp_schedule]
        values["pipeline_parallel_microbatch_size"] = plan.batch_size // pipeline_microbatches(plan, plan.pp)
    if plan.zero == 1:
        missing.append("ZeRO-1: torchtitan has no optimizer-only sharding; the file shards with FSDP without "
                       "resharding after forward (ZeRO-2), which holds less memory than the plan")
    if plan.tp > 1 and not plan.sequence_parallel:
        missing.append("tensor parallel without sequence parallel: torchtitan's tensor parallel always shards the "
                       "norms over the sequence, which holds less activation memory than the plan")
    return values, missing


def _numerics(plan: Plan) -> tuple[dict, dict, list[str]]:
    """(training keys, optimizer section, what does not fit them)."""
    training = {"mixed_precision_param": "bfloat16" if plan.precision == "bf16" else "float32"}
    missing = []
    if plan.precision == "bf16-pure":
        training["dtype"] = "bfloat16"
    if plan.precision == "fp16":
        missing.append("fp16: torchtitan's mixed precision is bfloat16 or float32 (set here: float32)")
    if plan.precision == "tf32":
        missing.append("tf32: torch.backends.cuda.matmul.allow_tf32 = True is not a torchtitan setting")
    optimizer = {"name": "AdamW", "lr": plan.lr, "weight_decay": plan.weight_decay,
                 "implementation": "fused" if plan.optim == "adamw-fused" else "foreach"}
    if plan.optim not in ("adamw", "adamw-fused"):
        missing.append(f"optimizer {plan.optim}: torchtitan's optimizers are AdamW and Adam (set here: AdamW)")
    return training, optimizer, missing


def _checkpointing(plan: Plan) -> tuple[dict, list[str]]:
    if not plan.grad_ckpt:
        return {"mode": "none"}, []
    if plan.grad_ckpt_every > 1:
        missing = ["selective checkpointing every K blocks: torchtitan checkpoints every K-th block fully "
                   f"(set here: every {plan.grad_ckpt_every}), or each op selectively"] \
            if plan.grad_ckpt_policy == "selective" else []
        return {"mode": "selective", "selective_ac_option": str(plan.grad_ckpt_every)}, missing
    if plan.grad_ckpt_policy == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}, []
    return {"mode": "full"}, []


def _not_in_torchtitan(plan: Plan, launch: Launch) -> list[str]:
    missing = []
    if launch.data:
        missing.append(f"data {launch.data}: torchtitan reads datasets registered by name (set here: c4); "
                       "register yours in torchtitan.datasets")
    for on, what in ((plan.lora, f"LoRA rank {plan.lora_rank}"), (plan.kernels == "liger", "liger kernels"),
                     (plan.loss == "fused", "fused loss"), (plan.activation_offload, "activation offload"),
                     (plan.packing == "documents", "packing documents"),
                     (plan.attention not in ("sdpa", "auto"), f"attention {plan.attention} (torchtitan: sdpa, or "
                                                              "flex/varlen flavors)"),
                     (plan.compile and plan.compile_scope == "model", "compile of the whole model (torchtitan "
                                                                      "compiles each block)")):
        if on:
            missing.append(f"{what}: not a torchtitan {RELEASE} setting")
    return missing


def torchtitan_config(plan: Plan, launch: Launch) -> tuple[str, list[str]]:
    """The job config TOML; run with torchtitan's `run_train.sh` (CONFIG_FILE=FILE) on each node."""
    flavor = flavor_of(launch.model)
    nodes, per_node = node_shape(plan, launch)
    parallelism, missing = _parallelism(plan)
    training, optimizer, numerics = _numerics(plan)
    checkpoint_mode, ckpt_missing = _checkpointing(plan)
    weights = local_path(launch.model) if Path(launch.model).exists() else None
    model = {"name": "llama3", "flavor": flavor,
             "hf_assets_path": weights or local_path(launch.tokenizer) or f"./assets/hf/{Path(launch.model).name}"}
    steps = launch.steps or RunConfig().steps  # what `trainwise train` runs when not told
    training.update(local_batch_size=plan.batch_size, global_batch_size=global_batch(plan), seq_len=plan.seq_len,
                    max_norm=plan.max_grad_norm, steps=steps, dataset="c4",
                    enable_cpu_offload=plan.cpu_offload)
    schedule = {"warmup_steps": plan.warmup_steps, "decay_type": "cosine" if plan.lr_schedule == "cosine" else "linear"}
    if plan.lr_schedule == "constant":
        schedule["decay_ratio"] = 0.0
    # Without --save-every trainwise saves at the end only; torchtitan saves at the last step too.
    checkpoint = {"enable": True, "folder": "checkpoint", "interval": launch.save_every or steps}
    if weights:
        checkpoint.update(initial_load_path=weights, initial_load_in_hf=True)
    if not (weights or launch.tokenizer):
        missing.append(f"tokenizer: put the model's Hugging Face tokenizer files in {model['hf_assets_path']} "
                       "(torchtitan's scripts/download_hf_assets.py), or give plan --tokenizer DIR")
    if plan.float8:
        model["converters"] = ["quantize.linear.float8"]
    sections = {"job": {"dump_folder": launch.output or "./outputs", "description": f"trainwise plan for {launch.model}"},
                "model": model, "optimizer": optimizer, "lr_scheduler": schedule, "training": training,
                "parallelism": parallelism, "checkpoint": checkpoint, "activation_checkpoint": checkpoint_mode,
                "compile": {"enable": plan.compile, "components": ["model", "loss"]}}
    missing += numerics + ckpt_missing + _not_in_torchtitan(plan, launch)
    how = [f"torchtitan {RELEASE} job config: {nodes} node(s) x {per_node} GPUs (NGPU={per_node}); run "
           "torchtitan's run_train.sh with CONFIG_FILE=THIS_FILE on each node (torchrun with --nnodes "
           f"{nodes} and a c10d rendezvous across nodes)"]
    return comments(how) + cannot_express_comments(missing) + "\n" + toml_text(sections), missing
