"""`--kernels liger` and `--float8`: GPU-only knobs. On a CPU machine what can be checked is
that each is refused where it cannot run (exit 2, one line naming the flag and the way out),
which families Liger patches, which layers float8 converts, how the optional packages are
declared, and (where torchao is installed) that the estimate traces float8 matmuls and
prices them at the float8 rate. What they do on a GPU is measured by
benchmarks/gpu_validation.sh (stage engine-speed)."""

from __future__ import annotations

import sys
import tomllib
import types
from pathlib import Path

import pytest
from torch import nn

from float8_package import needs_torchao
from trainwise.api.compatibility import check_request
from trainwise.cli.main import main
from trainwise.hardware import resolve_device
from trainwise.hardware.catalog import catalog
from trainwise.models import build_model, resolve_model
from trainwise.plan import InputError, Plan
from trainwise.techniques import kernels as kernels_module
from trainwise.techniques.float8 import float8_layer_filter
from trainwise.techniques.kernels import LIGER_FAMILIES, liger_arguments

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--seq-len", "16", "--batch-size", "1"]
F8 = {"float8": True, "precision": "bf16", "compile": True}


def _argv(command: str, tmp_path, *flags: str) -> list[str]:
    extra = {"estimate": [],
             "train": ["--steps", "1", "--data", "synthetic", "--output", str(tmp_path / "out")],
             "bench": ["--steps", "3", "--baseline", "none", "--out", str(tmp_path / "out")]}[command]
    return [command, "tiny-llama", *SMALL, *extra, *flags]


def _one_line_exit_2(capsys, argv, field: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith(f"trainwise: error: {field}: "), err
    return err[0]


def _refusal(plan: Plan, model: str = "tiny-llama", here: bool = False) -> InputError:
    with pytest.raises(InputError) as refused:
        check_request(plan, resolve_device(plan.device), resolve_model(model), here=here)
    return refused.value


@pytest.mark.fault
@pytest.mark.parametrize("command", ("estimate", "train", "bench"))
@pytest.mark.parametrize("flags, field, says", [
    (["--kernels", "liger"], "--kernels", "needs a CUDA GPU"),
    (["--float8", "--precision", "bf16", "--compile"], "--float8", "needs a CUDA GPU of compute capability 8.9+"),
])
def test_gpu_only_knobs_are_refused_on_a_cpu_by_every_command(command, flags, field, says, tmp_path, capsys,
                                                                fault_log):
    message = _one_line_exit_2(capsys, _argv(command, tmp_path, "--device", "cpu", *flags), field)
    assert says in message and "the target is cpu" in message
    assert not (tmp_path / "out").exists()
    fault_log(kind="bad input", case=f"{command} tiny-llama --device cpu {' '.join(flags)}", exit_code=2,
              message=message)


@pytest.mark.fault
@pytest.mark.parametrize("gpu, capability", [("A100-80GB", "8.0"), ("RTX-3090", "8.6")])
def test_float8_is_refused_on_a_gpu_older_than_ada(gpu, capability, capsys, fault_log):
    message = _one_line_exit_2(capsys, ["estimate", "tiny-llama", *SMALL, "--device", gpu, "--float8",
                                        "--precision", "bf16"], "--float8")
    assert f"needs compute capability 8.9+" in message and f"has {capability}" in message
    fault_log(kind="bad input", case=f"estimate --device {gpu} --float8", exit_code=2, message=message)


def test_the_catalog_knows_which_gpus_have_float8_tensor_cores():
    has_float8 = {gpu.name for gpu in catalog() if gpu.supports_float8}
    assert has_float8 == {"H100-80GB", "H100-PCIe", "H200", "RTX-4090", "L4"}
    # The same GPUs are the ones with a catalog float8 rate for the time model.
    assert has_float8 == {gpu.name for gpu in catalog() if gpu.peak("fp8")}


@pytest.mark.fault
@pytest.mark.parametrize("knobs, says", [
    ({"precision": "fp32"}, "use --precision bf16 or bf16-pure"),
    ({"lora_rank": 8}, "LoRA (--lora-rank) is not supported yet"),
])
def test_float8_refuses_what_it_does_not_compose_with(knobs, says, fault_log):
    refused = _refusal(Plan(device="H100", **{**F8, **knobs}))
    assert refused.field == "--float8" and says in refused.message
    fault_log(kind="bad input", case=f"--float8 with {knobs}", exit_code=2, message=f"trainwise: error: {refused}")


@pytest.mark.fault
def test_a_run_here_needs_torchao_and_compile_while_estimate_predicts_for_elsewhere(monkeypatch, fault_log):
    from trainwise.techniques import float8 as float8_module

    plan = Plan(device="H100", **F8)
    monkeypatch.setattr(float8_module, "installed", lambda package: True)  # the estimate traces torchao
    check_request(plan, resolve_device("H100"), resolve_model("tiny-llama"), here=False)
    monkeypatch.setattr(float8_module, "installed", lambda package: False)
    missing = _refusal(plan, here=True)
    assert missing.field == "--float8" and "pip install 'trainwise[gpu]'" in missing.message
    monkeypatch.setattr(float8_module, "installed", lambda package: True)
    eager = _refusal(plan.replace(compile=False), here=True)
    assert eager.field == "--float8" and eager.message.endswith("add --compile")
    for refused, case in ((missing, "without torchao"), (eager, "without --compile")):
        fault_log(kind="bad input", case=f"train --float8 {case}", exit_code=2, message=f"trainwise: error: {refused}")


@pytest.mark.fault
def test_estimate_of_float8_without_torchao_is_refused_with_the_install_line(monkeypatch, fault_log):
    from trainwise.techniques import float8 as float8_module

    monkeypatch.setattr(float8_module, "installed", lambda package: False)
    refused = _refusal(Plan(device="H100", **F8), here=False)
    assert refused.field == "--float8" and "torchao" in refused.message and "trainwise[gpu]" in refused.message
    fault_log(kind="bad input", case="estimate --float8 without torchao", exit_code=2,
              message=f"trainwise: error: {refused}")


@pytest.mark.fault
@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-bert", "tiny-mixtral", "tiny-t5"])
def test_liger_is_refused_for_a_family_it_does_not_patch_naming_the_ones_it_does(model, fault_log):
    refused = _refusal(Plan(device="H100", kernels="liger", precision="bf16"), model)
    assert refused.field == "--kernels" and "llama, mistral, qwen2, qwen3, gemma" in refused.message
    assert refused.message.endswith("use --kernels none")
    fault_log(kind="bad input", case=f"--kernels liger on {model}", exit_code=2, message=f"trainwise: error: {refused}")


@pytest.mark.fault
def test_liger_needs_the_package_here_but_estimate_predicts_for_elsewhere(monkeypatch, fault_log):
    plan = Plan(device="H100", kernels="liger", precision="bf16")
    for model in ("tiny-llama", "Mistral-7B-v0.1", "Qwen2.5-0.5B"):  # families Liger patches pass here
        check_request(plan, resolve_device("H100"), resolve_model(model), here=False)
    monkeypatch.setattr(kernels_module, "installed", lambda package: False)
    missing = _refusal(plan, here=True)
    assert missing.field == "--kernels" and "pip install 'trainwise[gpu]'" in missing.message
    check_request(plan, resolve_device("H100"), resolve_model("tiny-llama"), here=False)  # estimate: traced stand-in
    fault_log(kind="bad input", case="train --kernels liger without liger-kernel", exit_code=2,
              message=f"trainwise: error: {missing}")


def test_liger_patches_every_kernel_and_fuses_the_loss_only_when_asked_under_a_language_model_head():
    assert liger_arguments("llama", "causal-lm", "fused") == {"rope": True, "rms_norm": True, "swiglu": True,
                                                              "cross_entropy": False, "fused_linear_cross_entropy": True}
    assert liger_arguments("llama", "causal-lm")["fused_linear_cross_entropy"] is False  # --loss default
    assert liger_arguments("gemma2", "causal-lm")["geglu"] is True  # Gemma's gated MLP is GeGLU
    assert liger_arguments("qwen2", "seq-cls", "fused")["fused_linear_cross_entropy"] is False
    assert set(LIGER_FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"}


def test_the_recipe_hands_the_built_model_to_the_family_patch(monkeypatch):
    """The engine's recipe patches the unmodified model it built, through the family's own
    Liger function (a recording stand-in for liger_kernel, which needs Triton); a model on
    the meta device (a trace) gets trainwise's traced stand-in instead."""
    from trainwise.techniques import precision_policy, prepare_model

    calls = []
    stand_in = types.ModuleType("liger_kernel.transformers")
    stand_in.apply_liger_kernel_to_llama = lambda model, **options: calls.append((model, options))
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", stand_in)
    model = build_model(resolve_model("tiny-llama"), "cpu")
    prepared = prepare_model(model, Plan(kernels="liger"), precision_policy("fp32", "cpu"), "causal-lm")
    assert prepared is model and [c[0] for c in calls] == [model]
    assert calls[0][1] == liger_arguments("llama", "causal-lm")
    prepare_model(build_model(resolve_model("tiny-llama"), "meta"), Plan(), precision_policy("fp32", "cpu"), "causal-lm")
    traced = prepare_model(build_model(resolve_model("tiny-llama"), "meta"), Plan(kernels="liger"),
                           precision_policy("fp32", "cpu"), "causal-lm")
    assert len(calls) == 1  # --kernels none patches nothing; a traced model gets the stand-in
    assert traced.model.norm.forward.__func__.__name__ == "_norm_forward"


def test_float8_converts_the_block_linears_and_leaves_the_head_and_odd_widths():
    model = build_model(resolve_model("tiny-llama"), "meta")
    keep = float8_layer_filter(model)
    chosen = {name for name, module in model.named_modules() if keep(module, name)}
    linears = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    assert "lm_head" in linears and "lm_head" not in chosen
    assert chosen == linears - {"lm_head"}  # tiny-llama's widths (64, 32, 176) are multiples of 16
    odd = nn.ModuleDict({"square": nn.Linear(64, 64), "narrow": nn.Linear(64, 24), "short": nn.Linear(8, 64)})
    keep_odd = float8_layer_filter(odd)
    assert [name for name, module in odd.items() if keep_odd(module, name)] == ["square"]


@pytest.mark.float8
def test_float8_with_torchao_swaps_exactly_the_filtered_layers():
    needs_torchao()
    from torchao.float8.float8_linear import Float8Linear

    from trainwise.techniques.float8 import apply_float8

    model = apply_float8(build_model(resolve_model("tiny-llama"), "meta"), Plan(**F8))
    swapped = {name for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    assert len(swapped) == 14 and not isinstance(model.lm_head, Float8Linear)  # 7 linears x 2 blocks


@pytest.mark.float8
def test_the_estimate_traces_float8_matmuls_at_the_float8_rate():
    needs_torchao()  # float8 runs compiled only (eager float8 is refused on any target)
    from trainwise.api import estimate

    plain = estimate("tiny-llama", Plan(device="H100", precision="bf16", compile=True, seq_len=64, batch_size=2))
    fp8 = estimate("tiny-llama", Plan(device="H100", precision="bf16", float8=True, compile=True, seq_len=64,
                                      batch_size=2))
    # The block matmuls run at the float8 rate; the casts to float8 are extra element-wise work.
    assert fp8.time.breakdown["matmul"] < plain.time.breakdown["matmul"]
    assert fp8.time.breakdown["elementwise"] > plain.time.breakdown["elementwise"]


@pytest.mark.float8
def test_fsdp_gathers_float8_weights_at_one_byte_and_reduces_each_scale_first():
    """Under FSDP2 torchao all-gathers a float8 layer's weight in float8: the estimate's
    gathered-parameter buffer drops by one byte per converted element of each gathered
    block, the all-gather moves those bytes less, and each gather pays one scale all-reduce
    per float8 weight (7 per tiny-llama block)."""
    needs_torchao()
    from trainwise.api import estimate

    layout = {"device": "H100", "nproc": 2, "fsdp": 2, "zero": 3, "precision": "bf16", "compile": True,
              "seq_len": 64, "batch_size": 2}
    plain, fp8 = (estimate("tiny-llama", Plan(**layout, float8=f8)) for f8 in (False, True))
    block = build_model(resolve_model("tiny-llama"), "meta").model.layers[0]
    keep = float8_layer_filter(block)
    converted = sum(module.weight.numel() for name, module in block.named_modules() if keep(module, name))
    buffer = "fsdp all-gathered parameters"
    saved = (plain.layout["pipeline_ranks"][0]["communication_buffers"][buffer]
             - fp8.layout["pipeline_ranks"][0]["communication_buffers"][buffer])
    assert saved > 0 and saved % converted == 0  # bf16 (2 B) -> float8 (1 B), per gathered block

    def gathered(result):
        return next(c["bytes"] for c in result.time.collectives if c["name"] == "all_gather")

    # Forward and ZeRO-3's backward gather each of the 2 blocks once; the root unit is not float8.
    assert gathered(plain) - gathered(fp8) == 2 * 2 * converted
    assert fp8.time.breakdown["communication_exposed"] > plain.time.breakdown["communication_exposed"]


def test_the_gpu_extra_pins_every_optional_gpu_package():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {spec.split(">")[0].split("<")[0].split("=")[0].strip(): spec for spec in extras["gpu"]}
    assert set(names) == {"bitsandbytes", "liger-kernel", "torchao"}
    assert all("<" in names[name] and ">=" in names[name] for name in ("liger-kernel", "torchao"))
    base = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert "liger" not in base and "torchao" not in base  # GPU-only: never in the base install


def test_a_converted_layer_sees_its_input_in_the_autocast_dtype_of_either_device():
    """torchao casts a float8 layer's input only under CUDA autocast; the estimate traces a
    CUDA step under CPU autocast, so the layer's pre-hook casts there too (a GPU run: no-op)."""
    import torch

    from trainwise.techniques.float8 import _input_in_autocast_dtype

    layer, x = nn.Linear(16, 16), torch.ones(2, 16)
    assert _input_in_autocast_dtype(layer, (x,)) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (cast,) = _input_in_autocast_dtype(layer, (x,))
    assert cast.dtype == torch.bfloat16


@pytest.mark.fault
def test_the_trainer_baseline_refuses_the_gpu_knobs_as_trainwise_does(tmp_path, capsys, fault_log):
    import json

    from trainwise.bench import hf_trainer_worker

    for knobs, field in (({"kernels": "liger"}, "--kernels"), ({"float8": True, "precision": "bf16"}, "--float8")):
        plan_file = tmp_path / "plan.json"
        plan_file.write_text(json.dumps({**Plan(device="cpu", seq_len=16, batch_size=1).to_dict(), **knobs}))
        code = hf_trainer_worker.main(["tiny-llama", "--plan", str(plan_file), "--data", "synthetic", "--steps", "1",
                                       "--metrics", str(tmp_path / "m.jsonl")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"trainwise: error: {field}: ")
        assert "needs a CUDA GPU" in err[0] and "the target is cpu" in err[0]
        fault_log(kind="bad input", case=f"Trainer baseline row with {knobs} on cpu", exit_code=2, message=err[0])


def test_float8_on_a_model_with_no_linear_layer_to_convert_is_refused_not_run_in_bf16():
    # GPT-2's projections are transformers' Conv1D: float8 training would convert nothing.
    from trainwise.common.errors import InputError
    from trainwise.techniques.float8 import apply_float8

    with pytest.raises(InputError) as refused:
        apply_float8(build_model(resolve_model("tiny-gpt2"), "meta"), Plan(**F8))
    assert refused.value.field == "--float8" and "converts no layer" in str(refused.value)


def test_eager_float8_is_refused_for_any_target_not_only_here(capsys):
    # An estimate for a catalog GPU priced --float8 without --compile (eager casts, slower
    # than bf16) where a run anywhere refuses it: the published NeMo fp8 rows read 2-3x slow.
    refused = _refusal(Plan(device="H100", precision="bf16", float8=True, seq_len=16, batch_size=1))
    assert refused.field == "--float8" and "add --compile" in refused.message
    message = _one_line_exit_2(capsys, ["estimate", "tiny-llama", *SMALL, "--device", "H100", "--float8",
                                        "--precision", "bf16"], "--float8")
    assert "add --compile" in message
