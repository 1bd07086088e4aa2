"""The command line: documented JSON, one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from trainwise.cli.main import main

BERT_LARGE_PARAMS = 335_143_938


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_matches_the_documented_object(capsys):
    code, out, _ = run_cli(capsys, "estimate", "bert-large-uncased", "--batch-size", "4", "--seq-len", "512", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["model"] == "bert-large-uncased"
    assert data["params"] == data["trainable_params"] == BERT_LARGE_PARAMS
    assert data["device"] == "cuda"
    assert data["plan"]["batch_size"] == 4 and data["plan"]["seq_len"] == 512
    memory = data["memory"]
    for key in ("weights", "gradients", "optimizer", "activations", "temporary", "context",
                "peak_allocated", "peak_reserved", "device_total"):
        assert isinstance(memory[key], int), key
    assert memory["weights"] == 4 * BERT_LARGE_PARAMS
    assert memory["gradients"] == 4 * BERT_LARGE_PARAMS
    assert memory["device_total"] == memory["peak_reserved"] + memory["context"]
    assert memory["peak_reserved"] >= memory["peak_allocated"] > memory["weights"] + memory["activations"]


def test_estimate_table_says_whether_it_fits(capsys):
    code, out, _ = run_cli(capsys, "estimate", "tiny-llama", "--device", "T4", "--seq-len", "128", "--by-module")
    assert code == 0
    assert "fits T4" in out and "predicted" in out and "catalog" in out
    assert "model.layers.0" in out


def test_a_plan_that_does_not_fit_says_by_how_much(capsys):
    code, out, _ = run_cli(capsys, "estimate", "Llama-3.1-70B", "--device", "RTX-4090", "--seq-len", "1024",
                           "--batch-size", "1", "--precision", "bf16")
    assert code == 0
    assert "does not fit" in out and "misses by" in out


@pytest.mark.parametrize("argv, field", [
    (["estimate", "no-such-model"], "MODEL"),
    (["estimate", "gpt2", "--device", "Z100"], "--device"),
    (["estimate", "gpt2", "--batch-size", "0"], "--batch-size"),
    (["estimate", "gpt2", "--seq-len", "0"], "--seq-len"),
    (["estimate", "gpt2", "--seq-len", "4096"], "--seq-len"),
    (["estimate", "gpt2", "--lora-rank", "-1"], "--lora-rank"),
    (["estimate", "gpt2", "--device", "cpu", "--precision", "fp16"], "--precision"),
    (["estimate", "gpt2", "--device", "T4", "--precision", "bf16"], "--precision"),
    (["estimate", "gpt2", "--device", "cpu", "--optim", "adamw-8bit"], "--optim"),
    (["estimate", "t5-small", "--tp", "2"], "--tp"),
])
def test_bad_input_is_one_line_naming_the_field_exit_2(capsys, argv, field):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], err
    assert "Traceback" not in err


def test_malformed_plan_file_exits_2(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("batch_size: [1,\n")
    code, _, err = run_cli(capsys, "estimate", "tiny-llama", "--plan", str(path))
    assert code == 2 and "--plan" in err


def test_debug_shows_the_traceback():
    result = subprocess.run([sys.executable, "-m", "trainwise.cli.main", "estimate", "no-such-model", "--debug"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_models_lists_the_catalog_with_parameter_counts(capsys):
    code, out, _ = run_cli(capsys, "models", "--json")
    entries = {e["name"]: e for e in json.loads(out)}
    assert code == 0
    assert entries["bert-large-uncased"]["params"] == BERT_LARGE_PARAMS
    assert {"tiny-llama", "tiny-gpt2", "tiny-bert", "tiny-t5", "tiny-mixtral"} <= set(entries)


def test_by_module_shares_are_of_the_whole_models_activations_not_the_traced_blocks():
    from types import SimpleNamespace

    from rich.console import Console

    from trainwise.cli.render_estimate import _module_table

    # A 16-block model traced on 2 blocks: 2 x 10 bytes of blocks and a 20-byte head traced,
    # 16 x 10 + 20 = 180 bytes in the whole model.
    result = SimpleNamespace(traced_blocks=(0, 2), total_blocks=16, memory=SimpleNamespace(activations=180),
                             activations_by_module={"model.layers.0": 10, "model.layers.1": 10, "lm_head": 20})
    console = Console(width=200, record=True)
    console.print(_module_table(result))
    text = console.export_text()
    assert "share of all activations" in text
    assert "11.1 %" in text and "5.6 %" in text  # 20/180 and 10/180, not 50 % and 25 % of the traced 40
