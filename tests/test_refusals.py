"""Nothing silently changed: a request that cannot be done as asked is refused, the same way
by `estimate`, `train` and `bench` (exit 2, one line naming the field, before any model is
built), or the substitution is the user's explicit choice (`--attention auto`)."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from torch import nn

from trainwise.api import benchmark
from trainwise.api.oom_advice import fitting_changes
from trainwise.cli.main import main
from trainwise.hardware import resolve_device
from trainwise.models import resolve_model
from trainwise.plan import InputError, Plan

estimate_module = importlib.import_module("trainwise.api.estimate")  # the package exports the function
training = importlib.import_module("trainwise.engine.job")  # where the model is built
SMALL = ["--device", "cpu", "--seq-len", "16", "--batch-size", "1"]
COMMANDS = ("estimate", "train", "bench")


def _argv(command: str, model: str, tmp_path, *flags: str) -> list[str]:
    """`command MODEL` on a small CPU plan; train and bench write under tmp_path/out."""
    extra = {"estimate": [],
             "train": ["--steps", "1", "--data", "synthetic", "--output", str(tmp_path / "out")],
             "bench": ["--steps", "3", "--baseline", "none", "--out", str(tmp_path / "out")]}[command]
    return [command, model, *SMALL, *extra, *flags]


@pytest.fixture
def nothing_built(monkeypatch):
    """Building or running a model fails the command with exit 1 (not the 2 asked for)."""
    def built(*args, **kwargs):
        raise AssertionError("a model was built")

    for module, name in ((training, "_build"), (estimate_module, "_one_device"), (estimate_module, "_per_rank"),
                         (benchmark, "run_row"), (benchmark, "_predicted")):
        monkeypatch.setattr(module, name, built)


def _readable(message: str, tmp_path) -> str:
    """The message as the record shows it: the test's temporary folder as DIR."""
    return message.replace(str(tmp_path), "DIR")


def _refused(capsys, argv, field, tmp_path) -> str:
    """Run the CLI; assert exit 2, one stderr line naming `field`, no output written."""
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith(f"trainwise: error: {field}"), err
    assert not (tmp_path / "out").exists()
    return err[0]


@pytest.mark.fault
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flags, field", [
    (["--attention", "flash"], "--attention"),
    (["--classic", "vertical"], "--classic"),
    (["--classic", "data-parallel"], "--classic"),
    (["--sequence-parallel"], "--sequence-parallel"),
])
def test_a_request_cpu_cannot_honour_is_refused_alike_by_every_command(command, flags, field, tmp_path, capsys,
                                                                        nothing_built, fault_log):
    message = _refused(capsys, _argv(command, "tiny-llama", tmp_path, *flags), field, tmp_path)
    fault_log(kind="bad input", case=f"{command} tiny-llama --device cpu {' '.join(flags)}", exit_code=2,
              message=_readable(message, tmp_path))


@pytest.mark.parametrize("command", ["estimate", "plan"])
@pytest.mark.parametrize("classic", ["vertical", "data-parallel"])
def test_classic_on_gpus_is_refused_by_estimate_and_plan_alike(command, classic, capsys):
    """Neither prices a classic layout (one device's figure is not each GPU's): plan judges
    every candidate by its estimate, so it refuses the fixed flag up front rather than
    reporting that no plan could be traced. Same for one stack or two (tiny-t5)."""
    for model in ("tiny-llama", "tiny-t5"):
        code = main([command, model, "--device", "H100-SXM", "--classic", classic])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --classic: not supported yet"), err


@pytest.mark.fault
def test_flash_without_the_flash_attn_package_is_refused_where_the_run_happens(monkeypatch, fault_log):
    """On an A100 flash runs, so estimate (which predicts for a device that may be elsewhere)
    accepts it; a run here needs the package, else it would quietly become sdpa."""
    from trainwise.api.compatibility import check_request
    from trainwise.hardware import installation
    from trainwise.models import attention as attention_rule

    monkeypatch.setattr(installation, "installed", lambda package: False)
    monkeypatch.setattr(attention_rule, "installed", lambda package: False)
    plan, device = Plan(attention="flash", precision="bf16", device="A100-80GB"), resolve_device("A100-80GB")
    spec = resolve_model("tiny-llama")
    assert check_request(plan, device, spec, here=False)[0].attention == "flash"
    with pytest.raises(InputError) as refused:
        check_request(plan, device, spec, here=True)
    assert refused.value.field == "--attention" and "pip install flash-attn" in refused.value.message
    fault_log(kind="bad input", case="train --attention flash on a GPU without the flash-attn package",
              exit_code=2, message=f"trainwise: error: {refused.value}")


def test_attention_auto_is_the_explicit_choice_that_picks_and_says_what(capsys):
    code = main(["estimate", "tiny-llama", *SMALL, "--attention", "auto", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["plan"]["attention"] == "sdpa"
    assert data["notes"][0].startswith("--attention auto picked sdpa; flash needs a CUDA GPU")
    from trainwise.api.compatibility import check_request

    picked, notes = check_request(Plan(attention="auto", precision="bf16", device="A100-80GB"),
                                  resolve_device("A100-80GB"), resolve_model("tiny-llama"), here=False)
    assert picked.attention == "flash" and notes == ["--attention auto picked flash"]
    full, notes = check_request(Plan(attention="auto", device="A100-80GB"), resolve_device("A100-80GB"),
                                resolve_model("tiny-llama"), here=False)  # fp32: flash-attn refuses its inputs
    assert full.attention == "sdpa" and notes[0].startswith("--attention auto picked sdpa; flash runs in fp16 or bf16")


def nondeterministic_model(batch_size=2, seq_len=8):
    """A model function whose forward runs a kernel without a deterministic implementation
    on the CPU (Tensor.put_ with repeated indices)."""
    class Scatters(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(seq_len))

        def forward(self, x):
            slots = torch.zeros(seq_len).put_(torch.zeros(2, dtype=torch.long), torch.ones(2))
            return (self.weight * x.float()).mean() + 0 * slots.sum()

    return Scatters(), torch.ones(batch_size, seq_len)


@pytest.mark.fault
def test_deterministic_is_honoured_or_refused_never_a_warning(tmp_path, capsys, fault_log):
    try:
        code = main(["train", "test_refusals:nondeterministic_model", "--device", "cpu", "--steps", "2",
                     "--data", "synthetic", "--deterministic", "--output", str(tmp_path / "out")])
    finally:
        torch.use_deterministic_algorithms(False)  # process-wide: leave the other tests as they were
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --deterministic: the model runs put_")
    fault_log(kind="bad input", case="train --deterministic with a model using a non-deterministic kernel (put_)",
              exit_code=2, message=err[0])


@pytest.mark.fault
@pytest.mark.parametrize("content", ['[{"name": "vanilla", "engine": "trainwise", "sta', "\xff\xfe garbage",
                                     '{"rows": 3}'])
def test_bench_resume_refuses_a_corrupt_results_file_and_leaves_it(content, tmp_path, capsys, nothing_built,
                                                                   fault_log):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "results.json").write_text(content)
    fault_log.watch(out)
    code = main(["bench", "tiny-llama", *SMALL, "--steps", "3", "--baseline", "none", "--out", str(out), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(out / "results.json") in err[0] and "--resume" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    fault_log(kind="bad input", case=f"bench --resume with results.json holding {content[:20]!r}", exit_code=2,
              message=_readable(err[0], tmp_path))


@pytest.mark.fault
def test_out_of_memory_advice_suggests_only_what_runs_here(monkeypatch, fault_log):
    """A plan where 8-bit Adam is among the few predicted fits: without bitsandbytes it is
    not suggested."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "bitsandbytes" else real(name, *args))
    spec = resolve_model("tiny-llama")
    plan = Plan(device="A100-80GB", batch_size=1, seq_len=64, grad_ckpt=True, precision="bf16")
    eight_bit = estimate_module.estimate(spec, plan.replace(optim="adamw-8bit")).memory.device_total
    fits = fitting_changes(spec, plan, eight_bit)
    assert fits and all(change.get("optim") != "adamw-8bit" for change, _ in fits)
    fault_log(kind="bad input", case="out-of-memory advice on a machine without bitsandbytes", exit_code=None,
              message="suggested: " + "; ".join(str(change) for change, _ in fits))


def _directory(tmp_path, config) -> str:
    path = tmp_path / config.model_type
    config.save_pretrained(path)
    return str(path)


def _bad_llama(tmp_path, field, value) -> str:
    from transformers import LlamaConfig

    data = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       vocab_size=100).to_dict()
    path = tmp_path / f"bad-{field}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**data, field: value}))
    return str(path)


@pytest.mark.fault
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("field, value, says", [
    ("hidden_size", "big", "expected int"),
    ("num_hidden_layers", -1, "must be an int >= 1"),
    ("vocab_size", 0, "must be an int >= 1"),
    ("num_attention_heads", 3, "not a multiple of the number of attention heads"),
])
def test_a_config_json_with_a_bad_field_is_one_line_naming_it(command, field, value, says, tmp_path, capsys,
                                                              nothing_built, fault_log):
    model = _bad_llama(tmp_path, field, value)
    message = _refused(capsys, _argv(command, model, tmp_path), f"{model}/config.json", tmp_path)
    assert says in message and (field in message or field == "num_attention_heads")
    fault_log(kind="bad input", case=f"{command} on a config.json with {field}: {value!r}", exit_code=2,
              message=_readable(message, tmp_path))


def needs_a_size(model_size, batch_size=2):
    raise AssertionError("called")


@pytest.mark.fault
@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_function_with_the_wrong_signature_is_refused_before_it_is_called(command, tmp_path, capsys,
                                                                                  nothing_built, fault_log):
    message = _refused(capsys, _argv(command, "test_refusals:needs_a_size", tmp_path), "MODEL", tmp_path)
    assert "'model_size'" in message and "batch_size and seq_len" in message
    fault_log(kind="bad input", case=f"{command} on a model function needing an argument trainwise does not pass",
              exit_code=2, message=message)


def _video_classifier():
    from transformers import TimesformerConfig

    return TimesformerConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8, num_frames=2)


def _audio_codec():
    from transformers import EncodecConfig

    return EncodecConfig()


@pytest.mark.fault
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("config", [_video_classifier, _audio_codec], ids=["timesformer", "encodec"])
def test_a_model_of_an_unsupported_task_is_refused_with_the_supported_ones(command, config, tmp_path, capsys,
                                                                           nothing_built, fault_log):
    built = config()
    message = _refused(capsys, _argv(command, _directory(tmp_path, built), tmp_path), "MODEL", tmp_path)
    assert f"a {built.model_type} model" in message
    assert "causal-lm, seq-cls, seq2seq, masked-lm, token-cls, image-cls, speech-seq2seq, ctc, vision-lm" in message
    fault_log(kind="bad input", case=f"{command} on a tiny {built.model_type} config directory", exit_code=2,
              message=_readable(message, tmp_path))
