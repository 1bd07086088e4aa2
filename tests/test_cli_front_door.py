"""The command line as a newcomer meets it: a quickstart, a version, did-you-mean, one
error prefix, flags in sections, and answers before the heavy imports."""

import json
import subprocess
import sys

import pytest

from trainwise.cli.main import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_bare_trainwise_prints_the_three_command_quickstart(capsys):
    code, out, _ = run_cli(capsys)
    assert code == 0
    for command in ("trainwise estimate", "trainwise plan", "trainwise train tiny-llama --plan auto"):
        assert command in out
    assert "usage:" not in out


def test_version_comes_from_the_package_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainwise {version('trainwise')}"


def test_a_misspelled_flag_names_the_closest_flag_once_prefixed(capsys):
    code, _, err = run_cli(capsys, "train", "tiny-llama", "--seqlen", "4")
    assert code == 2
    assert err.strip() == "trainwise: error: train: unknown flag --seqlen (did you mean --seq-len?); see --help"
    assert err.count("trainwise") == 1


def test_a_missing_argument_is_named_without_repeating_the_program(capsys):
    code, _, err = run_cli(capsys, "estimate")
    assert code == 2 and err.count("trainwise") == 1 and "MODEL" in err


def test_debug_is_one_flag_on_every_command():
    from trainwise.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in {"": parser, **commands}.items():
        debug = [a for a in sub._actions if "--debug" in a.option_strings]
        assert len(debug) == 1, name


def test_debug_is_declared_in_one_place_in_the_source():
    from pathlib import Path

    import trainwise.cli

    sources = Path(trainwise.cli.__file__).parent.glob("*.py")
    assert sum(path.read_text().count('add_argument("--debug"') for path in sources) == 1


def _help_sections(command):
    from trainwise.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {group.title: [(a.option_strings or [a.dest])[0] for a in group._group_actions] for group in sub._action_groups}


@pytest.mark.parametrize("command", ["estimate", "plan", "train", "bench"])
def test_every_knob_flag_sits_in_the_section_its_declaration_names(command):
    from trainwise.engine.run_config import RunConfig
    from trainwise.plan import Plan
    from trainwise.plan.knobs import GROUPS

    sections = _help_sections(command)
    specs = (*Plan.specs(), *(RunConfig.specs() if command == "train" else ()))
    for spec in specs:
        assert spec.flag in sections[spec.group], (spec.name, spec.group)
    titles = [title for title in sections if title in GROUPS]
    assert titles == [title for title in GROUPS if title in titles]  # shown in the declared order
    assert len(titles) == len(GROUPS) - (command != "train")  # only train has run settings
    assert len(sections["options"]) < 15  # the command's own flags, not every knob in one list


def test_train_writes_to_out_and_still_accepts_output():
    from trainwise.cli.main import build_parser

    for flag in ("--out", "--output"):
        args = build_parser().parse_args(["train", "tiny-llama", flag, "runs/a"])
        assert args.output == "runs/a"
    assert "--out" in _help_sections("train")["run and output"]


def test_a_knob_must_name_a_known_section():
    from trainwise.plan.knobs import knob

    with pytest.raises(ValueError, match="knob group"):
        knob(1, "a knob", group="miscellaneous")


def test_train_and_export_json_and_the_tokenizer_travels_with_the_model(tmp_path, capsys):
    from test_chat_data import CONVERSATION, chat_tokenizer_dir, write_jsonl

    directory, _ = chat_tokenizer_dir(tmp_path)
    data_file = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 8)
    out = tmp_path / "run"
    code, stdout, _ = run_cli(capsys, "train", "tiny-llama", "--device", "cpu", "--data", str(data_file), "--chat",
                              "messages", "--tokenizer", str(directory), "--steps", "2", "--seq-len", "32",
                              "--batch-size", "2", "--no-chart", "--out", str(out), "--json")
    assert code == 0
    summary = json.loads(stdout.strip().splitlines()[-1])  # the whole stdout is that one line
    assert len(stdout.strip().splitlines()) == 1
    assert summary["model"] == "tiny-llama" and summary["output"] == str(out)
    assert summary["summary"]["steps"] == 2 and summary["plan"]["seq_len"] == 32
    assert (out / "final" / "tokenizer_config.json").is_file()

    code, stdout, _ = run_cli(capsys, "export", str(out), "--out", str(tmp_path / "hf"), "--json")
    assert code == 0
    exported = json.loads(stdout)
    assert exported["out"] == str(tmp_path / "hf") and exported["tokenizer"] == str(directory)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "hf").chat_template is not None


def test_model_names_get_did_you_mean_from_the_catalog_and_the_local_cache(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    (tmp_path / "models--acme--tiny-llamo").mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    code, _, err = run_cli(capsys, "estimate", "acme/tiny-lamo")
    assert code == 2 and "did you mean acme/tiny-llamo?" in err
    code, _, err = run_cli(capsys, "estimate", "acme--tiny-llamo")
    assert code == 2 and "in the local Hugging Face cache: acme/tiny-llamo" in err
    code, _, err = run_cli(capsys, "estimate", "tiny-lama")
    assert code == 2 and "closest catalog names: tiny-llama" in err


def test_a_misspelled_gpu_names_the_closest_catalog_gpu(capsys):
    code, _, err = run_cli(capsys, "estimate", "tiny-llama", "--device", "H10")
    assert code == 2 and "did you mean H100?" in err and err.count("trainwise") == 1


def test_train_device_naming_another_gpu_than_this_machines_is_refused(monkeypatch):
    import torch

    from trainwise.common.errors import InputError
    from trainwise.engine.runtime import runtime_device
    from trainwise.hardware import detect
    from trainwise.hardware.catalog import find_gpu
    from trainwise.hardware.device import detected_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(detect, "detect_gpus", lambda: [detected_device(find_gpu("A100-80GB"), 0)])
    with pytest.raises(InputError) as caught:
        runtime_device("H100")
    assert caught.value.field == "--device" and "A100-80GB" in caught.value.message
    assert runtime_device("A100") == torch.device("cuda", 0)  # the GPU here, by one of its names


@pytest.mark.parametrize("argv, field", [
    (["train", "tiny-llama", "--seqlen", "4"], "--seqlen"),
    (["train", "tiny-llama", "--data", "no-such-file.jsonl"], "--data"),
    (["train", "tiny-llama", "--chat", "messages", "--data", "builtin"], "--chat"),
    (["train", "tiny-llama", "--tokenizer", "no-such-dir"], "--tokenizer"),
    (["estimate", "tiny-llama", "--device", "H10"], "did you mean H100"),
    (["plan", "tiny-llama", "--device", "a100x"], "--device"),
    (["train", "tiny-llama", "--device", "H1000"], "--device"),
])
def test_a_bad_flag_or_missing_file_is_answered_before_torch_is_imported(argv, field, tmp_path):
    code = ("import sys; from trainwise.cli.main import main; "
            f"code = main({argv!r}); print(code, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert field in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, field", [
    (["estimate", "tiny-llama", "--device", "A100-40XB"], "--device"),
    (["estimate", "tiny-llama", "--precision", "fp33"], "--precision"),
    (["estimate", "tiny-llama", "--plan", "auto"], "--plan"),
    (["plan", "tiny-llama", "--device", "A100-40XB"], "--device"),
    (["plan", "tiny-llama", "--precision", "fp33"], "--precision"),
    (["plan", "tiny-llama", "--global-batch", "0"], "--global-batch"),
])
def test_estimate_and_plan_answer_a_bad_flag_before_torch_is_imported(argv, field, tmp_path):
    """torch and transformers take seconds to import: a typo costs a fraction of one."""
    test_a_bad_flag_or_missing_file_is_answered_before_torch_is_imported(argv, field, tmp_path)


def test_chat_checks_its_tokenizer_before_the_plan_search(tmp_path, capsys, monkeypatch):
    from test_chat_data import CONVERSATION, chat_tokenizer_dir, write_jsonl

    import trainwise.cli.train_auto as train_auto

    monkeypatch.setattr(train_auto, "resolve_auto", lambda *a, **k: pytest.fail("the search ran"))
    directory, _ = chat_tokenizer_dir(tmp_path, template="")
    data_file = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}] * 4)
    code, _, err = run_cli(capsys, "train", "tiny-llama", "--device", "cpu", "--plan", "auto", "--data", str(data_file),
                           "--chat", "messages", "--tokenizer", str(directory))
    assert code == 2 and err.startswith("trainwise: error: --chat") and "no chat template" in err


def test_a_bad_jsonl_line_is_one_line_of_ours_without_the_readers_noise(tmp_path, capfd):
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"text": "a"}\n{"text": b}\n')
    code = main(["train", "tiny-llama", "--device", "cpu", "--data", str(bad), "--steps", "1", "--seq-len", "8"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"trainwise: error: --data: {bad} line 2 is not one JSON object (Expecting value at "
                                 "column 10); .jsonl holds one JSON object per line"]


def test_checkpointing_turns_the_kv_cache_off_so_transformers_has_nothing_to_warn_about():
    from trainwise.models import build_model, resolve_model
    from trainwise.plan import Plan
    from trainwise.techniques import precision_policy, prepare_model

    spec = resolve_model("tiny-llama")
    plan = Plan(device="cpu", batch_size=1, seq_len=16, grad_ckpt=True)
    model = prepare_model(build_model(spec, "cpu"), plan, precision_policy("fp32", "cpu"), spec.task)
    assert model.config.use_cache is False  # else "`use_cache=True` is incompatible with gradient checkpointing"


@pytest.mark.parametrize("argv", [
    ["models"],
    ["estimate", "tiny-llama", "--device", "H100", "--seq-len", "64", "--tp", "2", "--pp", "2", "--nproc", "4"],
])
def test_tables_fit_80_columns_without_cutting_a_word(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line]
    if argv == ["models"]:
        assert any(line.startswith("│ Llama-3.2-1B ") for line in lines)  # the name MODEL takes, whole


@pytest.mark.parametrize("argv, expected", [
    (["estimat", "tiny-llama"], "trainwise: error: COMMAND: unknown 'estimat'; did you mean estimate?"),
    (["estimate", "tiny-llama", "--precision", "bf61"], "(got 'bf61'); did you mean bf16?"),
])
def test_a_misspelled_command_or_choice_names_the_closest(argv, expected, capsys):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and expected in err and err.count("trainwise") == 1


def test_the_api_package_imports_without_torch_and_its_estimate_stays_the_function(tmp_path):
    """The command line's pre-launch checks live in api/: importing api/ must not import torch,
    and `trainwise.api.estimate` names the function even after its module of that name loads."""
    code = ("import sys, types; import trainwise.api as api; light = 'torch' not in sys.modules; "
            "from trainwise.api.estimate import EstimateResult; from trainwise.api import estimate; "
            "print(light, callable(estimate) and not isinstance(estimate, types.ModuleType) and api.estimate is estimate)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.split() == ["True", "True"], result.stderr
