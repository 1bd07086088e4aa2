"""`--kernels liger` in the estimate: the stand-in for Liger's kernels (trainwise/techniques/
liger_stand_in.py) computes the unfused modules' math (real fp32 CPU tensors, forward and
backward), keeps what Liger keeps (the traced activations drop by exactly the bytes the
unfused norms and MLPs keep and Liger does not), and is priced as one op per kernel."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from transformers.models.gemma import modeling_gemma
from transformers.models.llama import modeling_llama

from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import Plan
from trainwise.techniques import compute_loss
from trainwise.techniques.kernels import liger_arguments
from trainwise.techniques.liger_stand_in import (GEMMA_CASTING, GatedActivationStandIn, NormCasting, RMSNormStandIn,
                                           patch_liger_stand_in, stand_in_rotary_pos_emb)
from trainwise.trace.step_trace import trace_training_step

TOKENS = (2, 32)  # batch, sequence


def _same_gradients(reference: torch.Tensor, candidate: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    """Outputs equal, and the gradients of both inputs lists under the same upstream gradient."""
    torch.testing.assert_close(candidate, reference, rtol=1e-5, atol=1e-5)
    upstream = torch.randn_like(reference)
    expected = torch.autograd.grad(reference, inputs, upstream)
    got = torch.autograd.grad(candidate, inputs, upstream)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_class, casting", [(modeling_llama.LlamaRMSNorm, NormCasting()),
                                                 (modeling_gemma.GemmaRMSNorm, GEMMA_CASTING["gemma"]),
                                                 (modeling_gemma.GemmaRMSNorm, GEMMA_CASTING["gemma2"])])
def test_the_rms_norm_stand_in_computes_the_unfused_norm_and_its_gradients(norm_class, casting):
    torch.manual_seed(0)
    norm = norm_class(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()  # not the initial ones/zeros, so a wrong offset shows
    x = torch.randn(*TOKENS, 64, requires_grad=True)
    _same_gradients(norm(x), RMSNormStandIn.apply(x * 1, norm.weight, 1e-6, casting), [x, norm.weight])


@pytest.mark.parametrize("activation, hf_activation", [("silu", "silu"), ("gelu_tanh", "gelu_pytorch_tanh")])
def test_the_gated_activation_stand_in_computes_the_unfused_mlp_and_its_gradients(activation, hf_activation):
    torch.manual_seed(0)
    config = modeling_llama.LlamaConfig(hidden_size=64, intermediate_size=176, hidden_act=hf_activation)
    mlp = modeling_llama.LlamaMLP(config)
    x = torch.randn(*TOKENS, 64, requires_grad=True)
    fused = mlp.down_proj(GatedActivationStandIn.apply(mlp.gate_proj(x), mlp.up_proj(x), activation))
    _same_gradients(mlp(x), fused, [x, mlp.gate_proj.weight, mlp.up_proj.weight])


def test_the_rotary_stand_in_rotates_q_and_k_as_the_unfused_function_in_their_storage():
    torch.manual_seed(0)
    batch, seq, heads, kv_heads, head_dim = *TOKENS, 4, 2, 16
    q_rows = torch.randn(batch, seq, heads * head_dim, requires_grad=True)
    k_rows = torch.randn(batch, seq, kv_heads * head_dim, requires_grad=True)
    angles = torch.randn(batch, seq, head_dim // 2).repeat(1, 1, 2)  # HF duplicates the frequencies
    cos, sin = angles.cos(), angles.sin()

    def heads_first(rows, n):  # as the attention views a projection's output: (batch, heads, seq, head_dim)
        return (rows * 1).view(batch, seq, n, head_dim).transpose(1, 2)

    q, k = heads_first(q_rows, heads), heads_first(k_rows, kv_heads)
    q_ref, k_ref = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    q_new, k_new = stand_in_rotary_pos_emb(heads_first(q_rows, heads), heads_first(k_rows, kv_heads), cos, sin)
    assert q_new.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()  # a fresh projection output
    _same_gradients(torch.cat([q_ref.flatten(), k_ref.flatten()]), torch.cat([q_new.flatten(), k_new.flatten()]),
                    [q_rows, k_rows])


def _tiny_config_folder(tmp_path, family: str, architecture: str) -> str:
    """A Hugging Face folder (config only) of a two-block model of `family`: the catalog
    has no Gemma or Qwen3 model small enough for a test."""
    config = {"model_type": family, "architectures": [architecture], "hidden_size": 64, "intermediate_size": 176,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "vocab_size": 1024, "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("family, architecture", [("llama", None), ("gemma", "GemmaForCausalLM"),
                                                  ("gemma2", "Gemma2ForCausalLM"),
                                                  ("gemma3_text", "Gemma3ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")])
def test_the_patched_model_trains_as_the_unpatched_one_and_restores_the_rotary_function(family, architecture,
                                                                                         tmp_path):
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama" if architecture is None else _tiny_config_folder(tmp_path, family, architecture))
    model = build_model(spec, "cpu")
    with torch.no_grad():  # Gemma's norm weights start at zero: a wrong offset would not show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_()
    patched = patch_liger_stand_in(copy.deepcopy(model), family, liger_arguments(family, "causal-lm"), "causal-lm")
    assert patched.model.norm.forward.__func__.__name__ == "_norm_forward"  # the patch is in place
    assert patched.model.layers[0].mlp.forward.__func__.__name__ == "_gated_mlp_forward"
    batch = example_batch(spec, *TOKENS, "cpu", generator=torch.Generator().manual_seed(0))
    reference, candidate = compute_loss(model, batch), compute_loss(patched, batch)
    torch.testing.assert_close(candidate, reference, rtol=1e-5, atol=1e-5)
    reference.backward()
    candidate.backward()
    for (name, p), q in zip(model.named_parameters(), patched.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    family_module = sys.modules[type(patched.model.layers[0].self_attn).__module__]
    assert family_module.apply_rotary_pos_emb is not stand_in_rotary_pos_emb  # swapped only while attending


def _liger_saves_less(spec, tokens: int) -> int:
    """Bytes of saved activations the unfused Llama keeps and Liger does not, under bf16
    autocast with float32 weights: each RMSNorm's float32 normalized rows (tokens x hidden)
    -- two per block and the final norm -- and each MLP's act(gate), a bf16 matmul's
    activation (tokens x intermediate)."""
    config = spec.config
    norms = 2 * config.num_hidden_layers + 1
    return norms * tokens * config.hidden_size * 4 + config.num_hidden_layers * tokens * config.intermediate_size * 2


@pytest.mark.parametrize("loss", ["default", "fused"])
def test_the_h100_estimate_with_liger_keeps_less_by_what_the_unfused_modules_keep(loss):
    plan = Plan(device="H100", precision="bf16", seq_len=TOKENS[1], batch_size=TOKENS[0], loss=loss)
    plain = estimate("tiny-llama", plan)
    liger = estimate("tiny-llama", plan.replace(kernels="liger"))
    expected = _liger_saves_less(resolve_model("tiny-llama"), TOKENS[0] * TOKENS[1])
    assert plain.memory.activations - liger.memory.activations == expected
    assert liger.time.step_s < plain.time.step_s  # fewer kernels, fewer bytes moved


def test_each_stand_in_kernel_is_priced_as_one_op_reading_and_writing_its_tensors_once():
    spec = resolve_model("tiny-llama")
    config, tokens = spec.config, TOKENS[0] * TOKENS[1]
    plan = Plan(device="H100", precision="bf16", seq_len=TOKENS[1], batch_size=TOKENS[0], kernels="liger")
    trace = trace_training_step(build_model(spec, "meta"), lambda: example_batch(spec, *TOKENS, "cpu"), plan,
                                "cuda", task=spec.task)
    norms, hidden = 2 * config.num_hidden_layers + 1, config.hidden_size
    forward = {"phase": "forward", "op_class": "normalization"}
    assert trace.op_costs.total(0, **forward) == norms  # one op per norm
    # float32 rows and weight read; float32 rows and one float32 per row written
    assert trace.op_costs.total(2, **forward) == norms * (tokens * hidden * 4 + hidden * 4)
    assert trace.op_costs.total(3, **forward) == norms * (tokens * hidden * 4 + tokens * 4)
    gated = {"phase": "backward", "op_class": "transcendental", "dtype": "bf16"}
    # backward of the gated activation: the gradient and both bf16 operands read, both overwritten
    assert trace.op_costs.total(3, **gated) == config.num_hidden_layers * 2 * tokens * config.intermediate_size * 2


@pytest.mark.fault
@pytest.mark.parametrize("model, device, extra, says", [
    ("tiny-llama", "cpu", [], "needs a CUDA GPU"),
    ("tiny-gpt2", "H100", [], "needs a model of the families it patches"),
    ("tiny-llama", "H100", ["--grad-ckpt", "--grad-ckpt-policy", "selective"], "rotates q and k in place"),
])
def test_estimate_still_refuses_liger_where_it_cannot_run(model, device, extra, says, capsys, fault_log):
    code = main(["estimate", model, "--seq-len", "16", "--batch-size", "1", "--device", device,
                 "--kernels", "liger", "--precision", "bf16", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --kernels: ") and says in err[0]
    fault_log(kind="bad input", case=f"estimate {model} --device {device} --kernels liger {' '.join(extra)}".strip(),
              exit_code=2,
              message=err[0])


def test_the_plan_search_tries_liger_on_a_cuda_target_and_keeps_it_when_predicted_faster():
    from trainwise.api.search import plan_search

    fixed = {"device", "precision", "optim", "attention", "grad_ckpt", "batch_size", "seq_len", "lora_rank"}
    base = Plan(device="H100", precision="bf16", optim="adamw", attention="sdpa", grad_ckpt=False,
                batch_size=TOKENS[0], seq_len=TOKENS[1])
    report = plan_search("tiny-llama", base, fixed)
    best, plain = report.result.ranked[0], next(c for c in report.result.ranked if c.plan.kernels == "none")
    assert best.plan.kernels == "liger" and best.exact
    assert best.step_s < plain.step_s and best.memory_bytes <= plain.memory_bytes
    # composed around the confirmed plans, and said so
    assert any("Liger kernels" in note for note in report.result.notes if note.startswith("composed"))


@pytest.mark.parametrize("kind, installed_only, installed, searched", [("cpu", False, True, False),
                                                                       ("cuda", False, False, True),
                                                                       ("cuda", True, False, False),
                                                                       ("cuda", True, True, True)])
def test_liger_is_searched_where_it_can_run(kind, installed_only, installed, searched, monkeypatch):
    # A catalog GPU's run may be elsewhere: searched, and the plan says liger-kernel is not here;
    # under --installed-only (the default for this machine's device) only when it is installed.
    from trainwise.hardware import Device
    from trainwise.plan import Plan
    from trainwise.search import refine
    from trainwise.search.space import build_space

    monkeypatch.setattr(refine, "installed", lambda package: installed and package == "liger_kernel")
    device = Device(kind=kind, name="test", source="catalog" if kind == "cuda" else "generic")
    space = build_space(Plan(device="cpu"), frozenset(), device, frozenset(), 8, installed_only=installed_only)
    assert any(r.name == "Liger kernels" for r in refine.refinements_for(space, device)) is searched
    if kind == "cuda" and not searched:
        assert any("needs liger-kernel (not installed here: pip install 'liger-kernel>=0.6,<0.9'); "
                   "--no-installed-only" in note for note in refine.not_allowed(space, device))
