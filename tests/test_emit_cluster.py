"""`plan --emit` for a cluster: a 64-GPU plan on 8 nodes of 8, written for every target, parses
(json, yaml, tomllib, `bash -n`) and says the plan's numbers: node count, GPUs per node,
parallel degrees, and micro-batch x accumulation x data-parallel degree = the plan's global
batch, also where a target drops pipeline parallel. The train lines are per node."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import tomllib

import pytest
import yaml

from trainwise.common.errors import InputError
from trainwise.plan import Plan
from trainwise.emit.targets import emit
from trainwise.emit.train_line import Launch, train_flags

# The 70B plan of docs/results/plan-search-cpu.md: 32 sharded replicas x 2 pipeline stages,
# micro-batch 16 in 8 pipeline chunks, accumulation 1: a global batch of 512 samples.
PLAN_70B = Plan(batch_size=16, grad_accum=1, seq_len=2048, precision="bf16", optim="adamw-fused", grad_ckpt=True,
                nproc=64, fsdp=32, zero=3, pp=2, pp_schedule="interleaved-1f1b", microbatches=8, device="H100")
LAUNCH = Launch("Llama-3.1-70B", gpus_per_node=8, data="corpus.jsonl", tokenizer="tokenizer-dir", steps=1000,
                output="/shared/runs/70b", save_every=200)


def _bash_syntax_ok(text: str) -> None:
    checked = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr


def _command(text: str, first: str) -> list[str]:
    """The words of the script line that starts with `first`."""
    (line,) = [line for line in text.splitlines() if line.startswith(first + " ")]
    return shlex.split(line)


def _value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_the_train_line_of_a_plan_over_several_nodes_is_the_per_node_line():
    words = shlex.split(train_flags(PLAN_70B, LAUNCH))
    assert (_value(words, "--nnodes"), _value(words, "--nproc")) == ("8", "8")  # --nproc is per node
    assert words.count("--nproc") == 1
    assert _value(words, "--node-rank") == "$NODE_RANK" and _value(words, "--rdzv-endpoint") == "$HEAD_NODE:29500"
    assert (_value(words, "--fsdp"), _value(words, "--pp"), _value(words, "--batch-size")) == ("32", "2", "16")
    # what the user gave plan trains, not the catalog model on builtin data
    assert (_value(words, "--data"), _value(words, "--tokenizer"), _value(words, "--out")) == (
        "corpus.jsonl", "tokenizer-dir", "/shared/runs/70b")
    assert (_value(words, "--steps"), _value(words, "--save-every")) == ("1000", "200")
    one_node = shlex.split(train_flags(PLAN_70B.replace(nproc=8, fsdp=4), Launch("Llama-3.1-70B", gpus_per_node=8)))
    assert _value(one_node, "--nproc") == "8" and "--nnodes" not in one_node


def test_torchrun_is_one_script_every_node_runs_with_a_c10d_rendezvous():
    text, missing = emit(PLAN_70B, "torchrun", LAUNCH)
    _bash_syntax_ok(text)
    words = _command(text, "torchrun")
    assert (_value(words, "--nnodes"), _value(words, "--nproc-per-node")) == ("8", "8")
    assert _value(words, "--rdzv-backend") == "c10d" and _value(words, "--rdzv-endpoint") == "$HEAD_NODE:29500"
    assert "--standalone" not in words and "--nproc" not in words and missing == []
    assert words[words.index("-m"):words.index("-m") + 4] == ["-m", "trainwise", "train", "Llama-3.1-70B"]
    assert (_value(words, "--fsdp"), _value(words, "--pp"), _value(words, "--out")) == ("32", "2", "/shared/runs/70b")


def test_the_slurm_script_asks_for_the_nodes_and_stops_before_the_time_limit():
    text, missing = emit(PLAN_70B, "slurm", dataclasses.replace(LAUNCH, max_restarts=5))
    _bash_syntax_ok(text)
    sbatch = dict(line.removeprefix("#SBATCH --").split("=", 1) for line in text.splitlines()
                  if line.startswith("#SBATCH"))
    assert sbatch["nodes"] == "8" and sbatch["gpus-per-node"] == "8" and sbatch["ntasks-per-node"] == "1"
    assert sbatch["signal"] == "TERM@120"  # to the job step (trainwise's ranks), not B: the batch shell
    words = _command(text, "srun")
    assert (_value(words, "--nnodes"), _value(words, "--nproc-per-node"), _value(words, "--max-restarts")) == (
        "8", "8", "5")
    assert _value(words, "--rdzv-endpoint") == "$HEAD_NODE:$RDZV_PORT" and _value(words, "--out") == "$OUTPUT"
    assert "OUTPUT=/shared/runs/70b" in text.splitlines() and "scontrol show hostnames" in text
    # torchrun gives its workers most of the 120 s to save, not its default 30 s
    assert "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=110" in text.splitlines()
    assert missing == []


def test_deepspeed_keeps_the_global_batch_when_it_drops_pipeline_parallel():
    text, missing = emit(PLAN_70B, "deepspeed", LAUNCH)
    config = json.loads(text)
    micro, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    # 64 data-parallel ranks without pipeline parallel; the micro-batch is the plan's pipeline chunk (16 / 8)
    assert (micro, accum, config["train_batch_size"]) == (2, 4, 512) and micro * accum * 64 == 512
    assert any(m.startswith("pipeline parallel 2") for m in missing)
    assert any(m.startswith("batch: pipeline parallel 2 dropped") and "512 samples" in m for m in missing)
    assert any("hostfile" in m and "--num_nodes 8 --num_gpus 8" in m for m in missing)


def test_accelerate_and_the_trainer_name_the_machines_and_the_kept_batch():
    text, missing = emit(PLAN_70B, "accelerate", LAUNCH)
    config = yaml.safe_load(text)
    assert (config["num_machines"], config["num_processes"], config["machine_rank"]) == (8, 64, 0)
    assert config["main_process_port"] == 29500 and config["main_process_ip"] == "HEAD_NODE"
    assert any(m == "micro-batch 2: set the DataLoader's batch_size" for m in missing)
    assert "# - accumulation 4: Accelerator(gradient_accumulation_steps=4)" in text.splitlines()
    args, missing = emit(PLAN_70B, "trainer", LAUNCH)
    args = json.loads(args)
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (2, 4)
    assert (args["output_dir"], args["max_steps"], args["save_steps"]) == ("/shared/runs/70b", 1000, 200)
    assert any(m.startswith("model Llama-3.1-70B, data corpus.jsonl") for m in missing)


def test_torchtitan_gets_the_degrees_and_batch_of_the_plan():
    text, missing = emit(PLAN_70B, "torchtitan", LAUNCH)
    config = tomllib.loads(text)
    parallel, training = config["parallelism"], config["training"]
    assert (parallel["data_parallel_replicate_degree"], parallel["data_parallel_shard_degree"],
            parallel["tensor_parallel_degree"], parallel["pipeline_parallel_degree"]) == (1, 32, 1, 2)
    assert parallel["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert parallel["pipeline_parallel_microbatch_size"] == 2  # 16 samples in 8 chunks
    assert (training["local_batch_size"], training["global_batch_size"], training["seq_len"]) == (16, 512, 2048)
    assert training["steps"] == 1000 and training["mixed_precision_param"] == "bfloat16"
    assert config["model"]["flavor"] == "70B" and config["activation_checkpoint"]["mode"] == "full"
    assert config["job"]["dump_folder"] == "/shared/runs/70b" and config["checkpoint"]["interval"] == 200
    assert config["optimizer"]["implementation"] == "fused"
    assert any(m.startswith("data corpus.jsonl") for m in missing)
    assert "# - data corpus.jsonl" in text


def test_torchtitan_maps_tensor_parallel_and_checkpointing_and_names_what_differs():
    plan = PLAN_70B.replace(fsdp=4, zero=2, tp=8, pp=2, microbatches=None, grad_ckpt_every=2, float8=True,
                            compile=True, sequence_parallel=False)
    text, missing = emit(plan, "torchtitan", Launch("Llama-3.1-70B", gpus_per_node=8))
    config = tomllib.loads(text)
    assert config["parallelism"]["tensor_parallel_degree"] == 8
    assert config["parallelism"]["fsdp_reshard_after_forward"] == "never"  # ZeRO-2
    assert config["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    assert config["model"]["converters"] == ["quantize.linear.float8"] and config["compile"]["enable"] is True
    assert any(m.startswith("tensor parallel without sequence parallel") for m in missing)


@pytest.mark.fault
def test_targets_that_cannot_train_a_plan_are_refused_with_the_reason(fault_log):
    with pytest.raises(InputError) as refused:
        emit(PLAN_70B, "torchtitan", Launch("tiny-gpt2"))
    assert refused.value.field == "--emit" and "flavors 8B, 70B, 405B" in refused.value.message
    fault_log(kind="bad input", case="--emit torchtitan for tiny-gpt2", exit_code=2, message=str(refused.value))
    # 3 sharded replicas x 2 stages train 3 samples a step: not a whole number on 6 ranks
    odd = Plan(batch_size=2, grad_accum=1, nproc=6, fsdp=3, zero=3, pp=2, microbatches=2, device="H100")
    with pytest.raises(InputError) as refused:
        emit(odd.replace(batch_size=1, microbatches=1), "deepspeed", "m")
    assert "does not divide" in refused.value.message
    fault_log(kind="bad input", case="--emit deepspeed of a 3-sample global batch on 6 GPUs", exit_code=2,
              message=str(refused.value))


def test_local_paths_the_user_gave_are_made_absolute_for_a_launch_from_elsewhere(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("hello\n")
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)
    words = shlex.split(train_flags(Plan(device="cpu"), Launch("my-model", data="corpus.txt", tokenizer="absent")))
    assert words[2] == str(tmp_path / "my-model") and _value(words, "--data") == str(tmp_path / "corpus.txt")
    assert _value(words, "--tokenizer") == "absent"  # not a path here: as given
    assert _value(words, "--device") == "cpu"  # the CPU is named; a catalog GPU is not (train uses the one present)
