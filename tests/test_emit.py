"""`--emit`: a plan written for the Trainer, accelerate, DeepSpeed or torchrun parses and
carries the plan's values; what a target cannot express is named, never dropped."""

from __future__ import annotations

import json
import shlex

import yaml

from trainwise.plan import Plan
from trainwise.emit.targets import emit
from trainwise.emit.train_line import train_flags

PLAN = Plan(batch_size=8, grad_accum=4, seq_len=2048, precision="bf16", optim="adamw-fused", grad_ckpt=True,
            attention="sdpa", device="H100")


def test_trainer_arguments_are_json_with_the_trainer_spelling_of_each_knob():
    text, missing = emit(PLAN, "trainer", "Llama-3.2-1B")
    args = json.loads(text)
    assert args["per_device_train_batch_size"] == 8 and args["gradient_accumulation_steps"] == 4
    assert args["bf16"] is True and args["fp16"] is False and args["gradient_checkpointing"] is True
    assert args["optim"] == "adamw_torch_fused" and args["torch_compile"] is False
    assert "fsdp" not in args and "deepspeed" not in args
    assert any(m.startswith("attention sdpa") for m in missing) and any(m.startswith("seq_len 2048") for m in missing)


def test_trainer_arguments_carry_the_sharding_and_name_pipeline_parallel_as_missing():
    text, missing = emit(PLAN.replace(nproc=8, zero=3, cpu_offload=True, pp=2), "trainer", "m")
    assert json.loads(text)["fsdp"] == "full_shard offload"
    assert any("pipeline parallel 2" in m for m in missing)
    zero1, _ = emit(PLAN.replace(nproc=8, zero=1), "trainer", "m")
    assert json.loads(zero1)["deepspeed"]["zero_optimization"]["stage"] == 1


def test_an_accelerate_config_is_yaml_with_the_mixed_precision_and_fsdp_strategy():
    text, missing = emit(PLAN.replace(nproc=4, zero=2, compile=True), "accelerate", "m")
    config = yaml.safe_load(text)
    assert config["mixed_precision"] == "bf16" and config["num_processes"] == 4
    assert config["distributed_type"] == "FSDP"
    assert config["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert config["dynamo_config"]["dynamo_backend"] == "INDUCTOR"
    assert any(m.startswith("micro-batch 8") for m in missing)


def test_a_deepspeed_config_has_the_zero_stage_offload_and_batch_shape_and_says_it_has_no_tp():
    text, missing = emit(PLAN.replace(nproc=8, fsdp=4, tp=2, zero=3, cpu_offload=True), "deepspeed", "m")
    config = json.loads(text)
    # Without tensor parallel the 8 GPUs are 8 data-parallel ranks, not 4: the plan's global
    # batch (8 x 4 x 4 = 128) is kept with the micro-batch 8 and half the accumulation.
    assert config["train_micro_batch_size_per_gpu"] == 8 and config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 8 * 4 * 4
    assert any(m.startswith("batch: tensor parallel 2 dropped") and "128 samples" in m for m in missing)
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False
    assert any(m.startswith("tensor parallel 2") and "DeepSpeed" in m for m in missing)


def test_the_torchrun_script_runs_trainwise_train_with_every_changed_knob():
    text, missing = emit(PLAN.replace(nproc=2, dp=2), "torchrun", "Llama-3.2-1B")
    assert text.startswith("#!/bin/bash\n")
    words = shlex.split(text.splitlines()[-1])
    assert words[:5] == ["torchrun", "--standalone", "--nproc-per-node", "2", "-m"]
    assert words[5:8] == ["trainwise", "train", "Llama-3.2-1B"]
    for flag, value in (("--batch-size", "8"), ("--grad-accum", "4"), ("--optim", "adamw-fused")):
        assert words[words.index(flag) + 1] == value
    # torchrun sets the world size: --nproc would make trainwise relaunch itself
    assert "--grad-ckpt" in words and "--device" not in words and "--nproc" not in words and missing == []


def test_the_flags_line_reads_back_as_the_same_plan():
    from trainwise.cli.main import build_parser
    from trainwise.cli.flags import plan_from_args

    words = shlex.split(train_flags(PLAN, "tiny-llama"))[1:]
    args = build_parser().parse_args(words + ["--device", "H100"])
    assert plan_from_args(args) == PLAN


def test_engine_techniques_no_launcher_holds_are_named_with_what_to_do():
    plan = PLAN.replace(loss="fused", grad_ckpt_policy="selective", grad_ckpt_every=2, activation_offload=True,
                        packing="documents", compile=True)
    text, missing = emit(plan, "trainer", "m")
    assert "use_liger_kernel" not in json.loads(text)
    for words in ("fused loss", "selective checkpointing", "checkpointing every 2 blocks", "activation offload",
                  "packing documents", "compile per block"):
        assert any(m.startswith(words) for m in missing), words
    liger, missing = emit(PLAN.replace(kernels="liger", loss="fused"), "trainer", "m")
    assert json.loads(liger)["use_liger_kernel"] is True
    assert not any(m.startswith("fused loss") for m in missing)  # Liger's fused loss comes with its kernels
