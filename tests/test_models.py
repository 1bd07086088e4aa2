"""Specification of trainwise.models: catalog, resolution, building and example batches."""

import dataclasses
import json

import pytest
import torch
from torch import nn
from transformers import AutoConfig, GPTNeoConfig, LlamaConfig

from trainwise.models import (
    TASKS,
    CatalogEntry,
    ModelSpec,
    build_model,
    build_model_with_notes,
    catalog_entries,
    check_seq_len,
    count_parameters,
    example_batch,
    resolve_model,
)
from trainwise.common.errors import InputError

# Parameter counts of the released models with their usual head, tied weights once.
HUB_PARAMETER_COUNTS = {
    "bert-base-uncased": 109_483_778,  # with a 2-label classification head
    "bert-large-uncased": 335_143_938,  # with a 2-label classification head
    "roberta-large": 355_361_794,  # with a 2-label classification head
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "t5-3b": 2_851_598_336,
    "Llama-3.2-1B": 1_235_814_400,
    "Llama-3.2-3B": 3_212_749_824,
    "Llama-3.1-8B": 8_030_261_248,
    "Llama-3.1-70B": 70_553_706_496,
    "Llama-3.1-405B": 405_853_388_800,
    "Llama-2-7b": 6_738_415_616,  # the hub models meta-llama/Llama-2-*-hf
    "Llama-2-13b": 13_015_864_320,
    "Llama-2-70b": 68_976_648_192,
    "Mistral-7B-v0.1": 7_241_732_096,
    "Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen2.5-0.5B": 494_032_768,
    "Qwen2.5-7B": 7_615_616_512,
}
TINY_MODELS = ["tiny-llama", "tiny-gpt2", "tiny-bert", "tiny-t5", "tiny-mixtral"]


def loss_of(model, batch):
    output = model(**batch) if isinstance(batch, dict) else model(batch)
    return output if isinstance(output, torch.Tensor) else output.loss


# --- catalog -------------------------------------------------------------------------


def test_bert_large_parameter_count_matches_hub_model():
    spec = resolve_model("bert-large-uncased")
    assert spec.task == "seq-cls"
    assert count_parameters(build_model(spec, device="meta")) == 335_143_938


@pytest.mark.parametrize("name", sorted(HUB_PARAMETER_COUNTS))
def test_catalog_model_builds_on_meta_with_hub_parameter_count(name):
    model = build_model(resolve_model(name), device="meta")
    assert count_parameters(model) == HUB_PARAMETER_COUNTS[name]
    assert all(p.device.type == "meta" for p in model.parameters())


def test_catalog_lists_every_required_model_with_its_count():
    entries = {entry.name: entry for entry in catalog_entries()}
    assert set(HUB_PARAMETER_COUNTS) | set(TINY_MODELS) <= set(entries)
    for name, count in HUB_PARAMETER_COUNTS.items():
        assert entries[name].params == count
        assert entries[name].hf_name and not entries[name].tiny
    assert all(entries[name].tiny for name in TINY_MODELS)
    assert isinstance(entries["gpt2"], CatalogEntry)
    assert (entries["gpt2"].family, entries["gpt2"].task) == ("gpt2", "causal-lm")


def test_usual_tasks_follow_the_classic_examples():
    assert resolve_model("roberta-large").task == "seq-cls"
    assert resolve_model("t5-base").task == "seq2seq"
    assert resolve_model("Mixtral-8x7B-v0.1").task == "causal-lm"


@pytest.mark.parametrize(
    "typed, name",
    [
        ("BERT-LARGE-UNCASED", "bert-large-uncased"),
        ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-8B", "Llama-3.1-8B"),
        ("llama-3.2-1b", "Llama-3.2-1B"),
        ("openai-community/gpt2", "gpt2"),
        ("Qwen/Qwen2.5-0.5B", "Qwen2.5-0.5B"),
    ],
)
def test_lookup_ignores_case_and_accepts_hub_ids(typed, name):
    spec = resolve_model(typed)
    assert (spec.name, spec.source) == (name, "catalog")


def test_unknown_name_suggests_close_catalog_names():
    with pytest.raises(InputError) as caught:
        resolve_model("lama-3.1-8b")
    assert caught.value.field == "MODEL"
    message = caught.value.message
    assert message.startswith("unknown model 'lama-3.1-8b'; closest catalog names: Llama-3.1-8B")
    assert message.endswith("(see `trainwise models`)")
    assert message.count(",") == 2


def test_tiny_mixtral_has_four_experts_two_active():
    config = resolve_model("tiny-mixtral").config
    assert (config.num_local_experts, config.num_experts_per_tok) == (4, 2)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-bert", "tiny-llama", "tiny-mixtral"])
def test_tiny_models_with_absolute_positions_take_512_tokens(name):
    assert resolve_model(name).max_positions >= 512


# --- tasks ---------------------------------------------------------------------------


def test_task_override_within_the_family():
    assert resolve_model("bert-base-uncased", task="masked-lm").task == "masked-lm"
    assert resolve_model("gpt2", task="seq-cls").task == "seq-cls"
    assert set(resolve_model("tiny-bert").allowed_tasks) == {"seq-cls", "masked-lm", "token-cls"}


def test_task_the_family_lacks_is_an_input_error_naming_allowed_tasks():
    with pytest.raises(InputError) as caught:
        resolve_model("t5-small", task="causal-lm")
    assert caught.value.field == "--task"
    assert "allowed: seq2seq" in caught.value.message


def test_unknown_task_lists_all_tasks():
    with pytest.raises(InputError) as caught:
        resolve_model("gpt2", task="translation")
    assert caught.value.field == "--task"
    assert all(task in caught.value.message for task in TASKS)


def test_sequence_classification_uses_two_labels_unless_config_says_otherwise(tmp_path):
    assert resolve_model("bert-large-uncased").config.num_labels == 2
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=128, num_labels=5)
    config.save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path), task="seq-cls")
    batch = example_batch(spec, batch_size=3, seq_len=8)
    assert spec.config.num_labels == 5 and batch["labels"].max() < 5


# --- building ------------------------------------------------------------------------


def test_405b_builds_on_meta_without_memory():
    spec = resolve_model("Llama-3.1-405B")
    model = build_model(spec, device="meta", dtype=torch.bfloat16)
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    assert next(model.parameters()).dtype == torch.bfloat16


def test_cpu_build_is_initialised_and_deterministic_under_manual_seed():
    spec = resolve_model("tiny-llama")
    torch.manual_seed(0)
    first = build_model(spec, device="cpu").state_dict()
    torch.manual_seed(0)
    second = build_model(spec, device="cpu").state_dict()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert first["model.layers.0.mlp.up_proj.weight"].std() > 0


def test_attention_choices_map_to_transformers_implementations():
    spec = resolve_model("tiny-llama")
    assert build_model(spec, attention="eager").config._attn_implementation == "eager"
    assert build_model(spec, attention="sdpa").config._attn_implementation == "sdpa"


def test_flash_on_meta_builds_the_traced_flash_kernel_not_sdpa():
    from trainwise.models.flash_trace import NAME

    built = build_model_with_notes(resolve_model("tiny-llama"), device="meta", attention="flash")
    assert built.attention_requested == "flash" and built.notes == ()
    assert built.attention_used == NAME == built.model.config._attn_implementation


def test_the_estimate_of_flash_traces_the_flash_kernel_and_refuses_fp32(monkeypatch):
    from trainwise.api import estimate
    from trainwise.common.errors import InputError
    from trainwise.models import flash_trace
    from trainwise.plan.plan import Plan

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return torch.ops.aten._flash_attention_forward(*args, **kwargs)

    monkeypatch.setattr(flash_trace, "KERNEL", counted)
    spec = resolve_model("tiny-llama")
    plan = Plan(device="H100-SXM", attention="flash", precision="bf16", batch_size=2, seq_len=40)
    result = estimate(spec, plan)
    assert not [note for note in result.notes if "sdpa" in note]
    assert calls and all(shape[:2] == (2, 40) for shape in calls)  # flash's layout: batch, seq, heads, dim
    calls.clear()
    estimate(spec, plan.replace(attention="sdpa"))
    assert not calls
    with pytest.raises(InputError) as refused:
        estimate(spec, plan.replace(precision="fp32"))
    assert refused.value.field == "--attention" and "fp16 or bf16" in refused.value.message


def test_flash_and_sdpa_price_the_same_attention_work():
    # PyTorch's FLOP formula for its FlashAttention-2 op reads (batch, seq, heads, dim) as
    # SDPA's (batch, heads, seq, dim): flash's attention was priced ~80x too cheap on Llama-3.2-1B
    # at sequence 2048 (an H100 plan 11 % faster for nothing).
    from trainwise.api import estimate
    from trainwise.plan.plan import Plan

    spec = resolve_model("tiny-llama")
    plan = Plan(device="H100-SXM", attention="flash", precision="bf16", batch_size=2, seq_len=512)
    flash, sdpa = (estimate(spec, plan.replace(attention=a)).time for a in ("flash", "sdpa"))
    assert flash.breakdown["attention"] == pytest.approx(sdpa.breakdown["attention"], rel=0.01)
    assert flash.mfu == pytest.approx(sdpa.mfu, rel=0.01)  # the same model FLOPs


def test_the_flash_kernels_flops_read_its_own_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainwise.trace.op_costs import kernel_flops

    aten = torch.ops.aten
    with FakeTensorMode():
        query = torch.empty(2, 256, 8, 64, dtype=torch.bfloat16)  # batch, seq, heads, head_dim
        for key in (torch.empty(2, 256, 8, 64, dtype=torch.bfloat16), torch.empty(2, 256, 2, 64, dtype=torch.bfloat16)):
            args = (query, key, key, None, None, 256, 256, 0.0, True, False)
            out = aten._flash_attention_forward(*args)
            # 2 matmuls of (seq x dim) by (dim x seq) per head and row: 4 * b * h * s^2 * d
            assert kernel_flops(aten._flash_attention_forward.default, args, {}, out) == 4 * 2 * 8 * 256 ** 2 * 64


def test_family_without_sdpa_falls_back_to_eager_with_a_note(tmp_path):
    GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=2, vocab_size=128,
                 attention_types=[[["global", "local"], 1]]).save_pretrained(tmp_path)
    built = build_model_with_notes(resolve_model(str(tmp_path)), device="meta", attention="sdpa")
    assert built.attention_used == "eager"
    assert "eager" in built.notes[0]


def test_unknown_attention_is_an_input_error():
    with pytest.raises(InputError) as caught:
        build_model(resolve_model("tiny-gpt2"), attention="paged")
    assert caught.value.field == "--attention"


def test_building_leaves_the_spec_config_untouched():
    spec = resolve_model("tiny-gpt2")
    before = spec.config.to_dict()
    build_model(spec, dtype=torch.bfloat16, attention="eager")
    assert spec.config.to_dict() == before


def test_model_spec_is_frozen():
    spec = resolve_model("gpt2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.task = "seq-cls"
    assert isinstance(spec, ModelSpec)
    assert (spec.family, spec.vocab_size, spec.max_positions) == ("gpt2", 50257, 1024)
    assert spec.hf_name == "openai-community/gpt2"


# --- real steps on tiny models -------------------------------------------------------


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_trains_one_step_on_cpu_with_its_example_batch(name):
    torch.manual_seed(0)
    spec = resolve_model(name)
    model = build_model(spec, device="cpu")
    batch = example_batch(spec, batch_size=2, seq_len=64, generator=torch.Generator().manual_seed(0))
    loss = loss_of(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name, task", [("tiny-gpt2", "seq-cls"), ("tiny-llama", "seq-cls"), ("tiny-bert", "masked-lm")])
def test_tiny_model_trains_with_an_overridden_task(name, task):
    spec = resolve_model(name, task=task)
    model = build_model(spec, device="cpu")
    loss = loss_of(model, example_batch(spec, batch_size=3, seq_len=32))
    loss.backward()
    assert torch.isfinite(loss)


# --- example batches -----------------------------------------------------------------


def test_example_batch_labels_follow_the_task():
    causal = example_batch(resolve_model("tiny-llama"), 2, 16)
    assert torch.equal(causal["labels"], causal["input_ids"])
    assert torch.equal(causal["attention_mask"], torch.ones(2, 16, dtype=torch.long))
    classify = example_batch(resolve_model("tiny-bert"), 4, 16)
    assert classify["labels"].shape == (4,) and classify["labels"].max() < 2
    seq2seq = example_batch(resolve_model("tiny-t5"), 2, 24)
    assert seq2seq["labels"].shape == (2, 24)
    masked = example_batch(resolve_model("tiny-bert", task="masked-lm"), 8, 256)
    targets = masked["labels"] != -100
    assert 0.1 < targets.float().mean() < 0.2
    assert torch.equal(masked["labels"][targets], masked["input_ids"][targets])


@pytest.mark.parametrize("name", ["gpt2", "Qwen2.5-7B", "t5-small", "tiny-mixtral"])
def test_example_token_ids_are_within_the_vocabulary(name):
    spec = resolve_model(name)
    batch = example_batch(spec, 4, 128)
    assert 0 <= batch["input_ids"].min() and batch["input_ids"].max() < spec.vocab_size


def test_example_batch_is_reproducible_with_a_generator_and_lands_on_the_device():
    spec = resolve_model("tiny-t5")
    first = example_batch(spec, 2, 8, generator=torch.Generator().manual_seed(3))
    second = example_batch(spec, 2, 8, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert example_batch(spec, 2, 8, device="meta")["input_ids"].device.type == "meta"


# --- sequence length -----------------------------------------------------------------


def test_seq_len_beyond_bert_positions_names_the_limit():
    spec = resolve_model("bert-large-uncased")
    check_seq_len(spec, 512)
    with pytest.raises(InputError) as caught:
        check_seq_len(spec, 513)
    assert caught.value.field == "--seq-len"
    assert caught.value.message == "must be <= 512 for bert-large-uncased (its max_position_embeddings)"


def test_gpt2_limit_is_called_n_positions():
    with pytest.raises(InputError, match="must be <= 1024 for gpt2 \\(its n_positions\\)"):
        check_seq_len(resolve_model("gpt2"), 1025)


def test_roberta_loses_two_positions_to_its_padding_offset():
    spec = resolve_model("roberta-large")
    assert spec.max_positions == 512
    check_seq_len(spec, 512)
    with pytest.raises(InputError, match="padding offset"):
        check_seq_len(spec, 514)


def test_t5_relative_positions_have_no_limit():
    spec = resolve_model("t5-small")
    assert spec.max_positions is None
    check_seq_len(spec, 100_000)


def test_example_batch_refuses_too_long_sequences():
    with pytest.raises(InputError):
        example_batch(resolve_model("tiny-bert"), 1, 513)


def test_seq_len_must_be_positive():
    with pytest.raises(InputError):
        check_seq_len(resolve_model("gpt2"), 0)


# --- model functions -----------------------------------------------------------------


class TinyRegressor(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(width, 1)

    def forward(self, inputs, targets):
        return nn.functional.mse_loss(self.layer(inputs).squeeze(-1), targets)


def sized_model_function(batch_size, seq_len):
    """Returns (model, batch) sized from the keywords trainwise passes."""
    model = TinyRegressor(seq_len)
    return model, {"inputs": torch.randn(batch_size, seq_len), "targets": torch.randn(batch_size)}


def fixed_model_function():
    """Takes no arguments; its batch is a single tensor."""
    return nn.Linear(4, 1), torch.randn(3, 4)


def not_a_model_function():
    return "model", "batch"


def test_function_model_receives_batch_size_and_seq_len():
    spec = resolve_model(f"{__name__}:sized_model_function")
    assert (spec.source, spec.task, spec.config, spec.max_positions) == ("function", "custom", None, None)
    batch = example_batch(spec, batch_size=5, seq_len=7)
    assert batch["inputs"].shape == (5, 7)
    model = build_model(spec, device="cpu", seq_len=7)
    assert torch.isfinite(loss_of(model, batch))


def test_function_model_is_called_under_meta_for_meta_builds():
    spec = resolve_model(f"{__name__}:sized_model_function")
    model = build_model(spec, device="meta", batch_size=2, seq_len=16)
    assert model.layer.weight.device.type == "meta" and model.layer.weight.shape == (1, 16)


def test_function_model_without_keywords_is_called_bare():
    spec = resolve_model(f"{__name__}:fixed_model_function")
    batch = example_batch(spec, batch_size=8, seq_len=8)
    assert isinstance(batch, torch.Tensor) and batch.shape == (3, 4)
    assert isinstance(build_model(spec, device="cpu"), nn.Linear)


@pytest.mark.parametrize(
    "reference", [f"{__name__}:no_such_function", "no_such_package_xyz.module:fn", f"{__name__}:not_a_model_function"]
)
def test_broken_function_reference_is_an_input_error(reference):
    with pytest.raises(InputError) as caught:
        build_model(resolve_model(reference), device="cpu")
    assert caught.value.field == "MODEL"


def test_function_model_refuses_a_task():
    with pytest.raises(InputError) as caught:
        resolve_model(f"{__name__}:sized_model_function", task="causal-lm")
    assert caught.value.field == "--task"


# --- local model directories ---------------------------------------------------------


def test_local_directory_loads_with_task_from_its_architectures(tmp_path):
    resolve_model("tiny-llama").config.save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    assert (spec.source, spec.family, spec.task) == ("directory", "llama", "causal-lm")
    model = build_model(spec, device="cpu")
    assert torch.isfinite(loss_of(model, example_batch(spec, 2, 16)))


def test_local_directory_without_architectures_uses_the_kind_of_model(tmp_path):
    encoder = AutoConfig.for_model("bert", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, vocab_size=100)
    encoder.save_pretrained(tmp_path / "encoder")
    assert resolve_model(str(tmp_path / "encoder")).task == "seq-cls"
    encoder.architectures = ["BertForMaskedLM"]
    encoder.save_pretrained(tmp_path / "masked")
    assert resolve_model(str(tmp_path / "masked")).task == "masked-lm"
    AutoConfig.for_model("t5", d_model=32, num_layers=1, num_heads=2).save_pretrained(tmp_path / "t5")
    assert resolve_model(str(tmp_path / "t5")).task == "seq2seq"


def test_directory_without_config_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_missing_path_is_reported_as_a_missing_directory():
    with pytest.raises(InputError, match="no model directory at './no/such/model'"):
        resolve_model("./no/such/model")


def test_remote_code_stays_off_by_default(tmp_path):
    marker = tmp_path / "code_ran"
    (tmp_path / "configuration_custom.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import PretrainedConfig\n"
        "class CustomConfig(PretrainedConfig):\n"
        "    model_type = 'trainwise-custom'\n"
    )
    config = {"model_type": "trainwise-custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as caught:
        resolve_model(str(tmp_path))
    assert caught.value.field == "MODEL" and "--trust-remote-code" in caught.value.message
    assert not marker.exists()
