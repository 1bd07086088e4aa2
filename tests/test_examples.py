"""examples/ runs as its README says, on a CPU: each GPU plan file is estimated for its
catalog GPU and fits; the chat file trains a tiny model with its tokenizer; the
TrainingArguments file is read into the plan it stands for, which trains; the Python API
script runs end to end."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from trainwise.api import estimate, train
from trainwise.cli.main import main
from trainwise.engine.run_config import RunConfig
from trainwise.plan import Plan, plan_from_sources
from trainwise.plan.foreign_config import read_foreign_configs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY_RUN = ["--device", "cpu", "--seq-len", "32", "--steps", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("name, model, layout", [("single-gpu", "Llama-3.2-1B", None),
                                                 ("fsdp", "Llama-3.1-8B", "8 ranks (fsdp=8, zero=3)"),
                                                 ("3d", "Llama-3.1-8B", "16 ranks (pp=2, fsdp=2, tp=4, zero=3)")])
def test_each_gpu_plan_is_estimated_for_its_catalog_gpu_and_fits(name, model, layout):
    plan = plan_from_sources(EXAMPLES / "plans" / f"{name}.yaml")
    result = estimate(model, plan, gpus_per_node=8)
    assert result.device.source == "catalog" and result.device.name == "H100-80GB"
    assert (result.layout or {}).get("description") == layout
    assert result.memory.device_total <= result.device.memory_bytes


def test_the_chat_tokenizer_holds_every_word_of_the_chat_file():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(EXAMPLES / "chat-tokenizer")
    for line in (EXAMPLES / "chat.jsonl").read_text().splitlines():
        messages = json.loads(line)["messages"]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert tokenizer.unk_token_id not in ids, messages


@pytest.mark.slow
def test_the_chat_example_trains_a_tiny_model_on_the_assistant_turns(tmp_path, capsys):
    code = main(["train", "tiny-llama", "--data", str(EXAMPLES / "chat.jsonl"), "--chat", "messages",
                 "--tokenizer", str(EXAMPLES / "chat-tokenizer"), *TINY_RUN, "--output", str(tmp_path / "run")])
    assert code == 0
    assert "final loss" in capsys.readouterr().out


@pytest.mark.slow
def test_the_training_arguments_file_is_estimated_and_its_plan_trains(tmp_path, capsys):
    path = str(EXAMPLES / "training_args.json")
    assert main(["estimate", "Llama-3.2-1B", "--device", "H100", "--seq-len", "2048",
                 "--from-training-args", path]) == 0
    values = read_foreign_configs([path], {}).values
    assert values == {**values, "batch_size": 4, "grad_accum": 8, "precision": "bf16", "grad_ckpt": True,
                      "optim": "adamw-fused"}
    # The same plan on a tiny model here (the optimizer's fused kernel exists on a CPU too).
    plan = Plan(**{**values, "device": "cpu", "seq_len": 32, "batch_size": 2, "grad_accum": 2})
    result = train("tiny-llama", data="synthetic", plan=plan, run=RunConfig(steps=2, output=str(tmp_path / "run")))
    assert result.plan.grad_ckpt and result.plan.precision == "bf16" and result.summary["final_loss"] > 0


@pytest.mark.slow
def test_the_api_example_predicts_plans_and_trains_end_to_end(tmp_path, capsys):
    runpy.run_path(str(EXAMPLES / "api_example.py"), run_name="example")["main"](str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "Llama-3.2-1B on H100-80GB:" in out and "(predicted), fits" in out
    assert "searched " in out and "trained 4 steps: final loss" in out
    assert (tmp_path / "run" / "final").is_dir()


def test_the_top_level_estimate_stays_the_function_after_an_estimate_ran():
    """`trainwise.estimate` is the function on every call: a package named like it would take
    its place on the module once the first estimate imported it (the second call then
    raised "'module' object is not callable")."""
    import trainwise

    plan = trainwise.Plan(device="cpu", seq_len=32)
    first = trainwise.estimate("tiny-llama", plan)
    second = trainwise.estimate("tiny-llama", plan)
    assert callable(trainwise.estimate)
    assert second.memory == first.memory
