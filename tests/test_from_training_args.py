"""`estimate --from-training-args FILE`: a Transformers TrainingArguments JSON, a DeepSpeed
config or an accelerate config becomes the Plan it stands for, with every setting mapped
approximately or ignored named, and anything without an equivalent refused."""

from __future__ import annotations

import json

import pytest
import yaml

from trainwise.cli.main import main
from trainwise.plan.foreign_config import read_foreign_configs

MODEL_ARGS = ("estimate", "tiny-llama", "--device", "cpu", "--seq-len", "32")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def training_args_file(tmp_path, **values) -> str:
    """A TrainingArguments JSON exactly as transformers writes it."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, **values)
    path = tmp_path / "training_args.json"
    path.write_text(args.to_json_string())
    return str(path)


def write(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(path)


def test_training_args_give_the_same_estimate_as_the_equivalent_flags(tmp_path, capsys):
    path = training_args_file(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3,
                              activation_checkpointing=True, optim="adamw_torch", learning_rate=2e-4)
    code, out, _ = run_cli(capsys, *MODEL_ARGS, "--from-training-args", path, "--json")
    assert code == 0
    read = json.loads(out)
    assert read["plan"]["batch_size"] == 2 and read["plan"]["grad_accum"] == 3
    assert read["plan"]["grad_ckpt"] is True and read["plan"]["optim"] == "adamw" and read["plan"]["lr"] == 2e-4
    code, out, _ = run_cli(capsys, *MODEL_ARGS, "--batch-size", "2", "--grad-accum", "3", "--grad-ckpt",
                           "--optim", "adamw", "--json")
    assert code == 0
    assert read["memory"] == json.loads(out)["memory"]
    settings = {s["setting"]: s for s in read["from_training_args"]["settings"]}
    assert settings["per_device_train_batch_size"]["how"] == "exact"
    assert not read["from_training_args"]["notes"]  # --seq-len was typed: nothing left open


def test_typed_flags_win_over_the_file(tmp_path, capsys):
    path = training_args_file(tmp_path, per_device_train_batch_size=8)
    code, out, _ = run_cli(capsys, *MODEL_ARGS, "--from-training-args", path, "--batch-size", "1", "--json")
    assert code == 0 and json.loads(out)["plan"]["batch_size"] == 1


def test_settings_without_a_model_are_listed_as_ignored_and_defaults_are_not(tmp_path):
    path = training_args_file(tmp_path, neftune_noise_alpha=5.0, lr_scheduler_type="cosine_with_restarts")
    config = read_foreign_configs([path], {})
    how = {s.key: s.how for s in config.settings}
    assert how["neftune_noise_alpha"] == "ignored"
    assert how["lr_scheduler_type"] == "approximate" and config.values["lr_schedule"] == "cosine"
    assert "label_smoothing_factor" not in how and "seed" not in how  # defaults / no effect on a step
    assert any("sequence length" in note and "--seq-len" in note for note in config.notes)


def test_the_table_names_what_was_mapped_approximately(tmp_path, capsys):
    path = training_args_file(tmp_path, optim="paged_adamw_8bit")
    code, out, err = run_cli(capsys, "estimate", "tiny-llama", "--device", "H100", "--seq-len", "32",
                             "--from-training-args", path)
    assert code == 0, err
    assert "paged_adamw_8bit" in out and "approximately" in out and "adamw-8bit" in out


def test_fsdp_full_shard_with_offload_becomes_zero3_over_the_given_gpus(tmp_path, capsys):
    path = training_args_file(tmp_path, fsdp=True, fsdp_config={"reshard_after_forward": True, "cpu_offload": True},
                              per_device_train_batch_size=1)
    code, out, _ = run_cli(capsys, "estimate", "tiny-llama", "--device", "H100", "--seq-len", "32",
                           "--from-training-args", path, "--nproc", "4", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["plan"]["zero"] == 3 and data["plan"]["cpu_offload"] is True
    assert data["layout"]["fsdp"] == 4


def test_the_older_fsdp_option_string_is_read_too(tmp_path):
    path = write(tmp_path, "args.json", {"per_device_train_batch_size": 1, "fsdp": "shard_grad_op auto_wrap offload"})
    config = read_foreign_configs([path], {"nproc": "8"})
    assert config.values["zero"] == 2 and config.values["cpu_offload"] is True


def test_deepspeed_inside_training_args_reads_auto_values_and_the_world_size(tmp_path):
    deepspeed = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "train_batch_size": 64, "bf16": {"enabled": True},
                 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True}}
    path = training_args_file(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    written = json.loads(open(path).read())  # the Trainer writes the config's path; deepspeed is not installed here
    written["deepspeed"] = write(tmp_path, "ds.json", deepspeed)
    path = write(tmp_path, "with_deepspeed.json", written)
    config = read_foreign_configs([path], {})
    assert config.values["batch_size"] == 4 and config.values["grad_accum"] == 2
    assert config.values["zero"] == 2 and config.values["cpu_offload"] is True
    assert config.values["nproc"] == 8  # 64 samples / (4 x 2) per GPU
    how = {s.key: s.how for s in config.settings}
    assert how["bf16.enabled"] == "approximate"  # bf16 weights + fp32 master vs autocast: said so
    assert how["zero_optimization.offload_optimizer"] == "approximate"  # params move too in trainwise
    assert how["zero_optimization.overlap_comm"] == "approximate"


def test_accelerate_fsdp_config_gives_the_layout_and_nodes(tmp_path):
    path = write(tmp_path, "accelerate.yaml", {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16",
        "num_machines": 2, "num_processes": 16,
        "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_activation_checkpointing": True}})
    config = read_foreign_configs([path], {})
    assert config.values == {"precision": "bf16", "zero": 2, "grad_ckpt": True, "nproc": 16}
    assert config.gpus_per_node == 8


@pytest.mark.fault
@pytest.mark.parametrize("case, make, field", [
    ("an optimizer with no equivalent", lambda p: training_args_file(p, optim="lion_8bit"), "optim"),
    ("FSDP without the number of GPUs", lambda p: training_args_file(p, fsdp=True), "--nproc"),
    ("DeepSpeed offload to NVMe", lambda p: write(p, "ds.json", {"train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}), "offload_param"),
    ("a file of no known kind", lambda p: write(p, "other.json", {"hello": 1}), "is not a TrainingArguments"),
    ("files that disagree", None, "batch-size"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(tmp_path, capsys, fault_log, case, make, field):
    if make is None:
        files = [training_args_file(tmp_path, per_device_train_batch_size=4),
                 write(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 2})]
    else:
        files = [make(tmp_path)]
    argv = [*MODEL_ARGS]
    for path in files:
        argv += ["--from-training-args", path]
    code, out, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and field in lines[0] and "Traceback" not in err
    fault_log(kind="bad input", case=f"--from-training-args: {case}", exit_code=code, message=lines[0])
