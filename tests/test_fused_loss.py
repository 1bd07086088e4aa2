"""`--loss fused`: the LM head and cross-entropy in chunks of tokens, never the full logits.

Numerics: the chunked function's loss and gradients equal autograd's through the full
logits; 20 training steps give the loss curve of `--loss default` (tiny-llama, and
tiny-gpt2 whose head is tied to its embedding). Memory: estimate's peak is within 3 % of a
real CPU step measured by tests/memory_reference.py, and with a large vocabulary the fused
peak is below the default one. Refusals: what it cannot run on exits 2 naming --loss."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from distributed_launch import CASES_WORKER, launch
from memory_reference import measure_step
from trainwise.api import estimate
from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan
from trainwise.techniques.fused_loss import chunk_rows, chunked_linear_cross_entropy

# fp32 on both paths: the only difference is the order of float32 sums (chunked logsumexp
# and weight-gradient accumulation), ~1e-7 relative per step; AdamW over 20 steps can
# amplify that, so the curves are held to 1e-4 relative, far below any real change
# (a wrong shift or mean moves the first loss by > 1e-2).
CURVE_TOLERANCE = 1e-4
PEAK_TOLERANCE = 0.03


def _random_case(rows=37, hidden=16, vocab=100, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=generator, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=generator, dtype=torch.float64) * 0.3
    b = torch.randn(vocab, generator=generator, dtype=torch.float64) * 0.1
    t = torch.randint(0, vocab, (rows,), generator=generator)
    t[::5] = -100  # some ignored tokens
    return h, w, b, t


@pytest.mark.parametrize("divisor", [None, 50.0], ids=["mean", "num-items"])
def test_chunked_loss_and_gradients_equal_autograd_through_full_logits(divisor):
    h, w, b, t = _random_case()
    assert chunk_rows(37, 16, 100) < 37  # several chunks are exercised
    leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    fused = chunked_linear_cross_entropy(*leaves, t, None if divisor is None else torch.tensor(divisor))
    (fused * 3.0).backward()  # backward scales the stored gradients by the incoming one
    reference_leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    logits = F.linear(reference_leaves[0], reference_leaves[1], reference_leaves[2])
    if divisor is None:
        reference = F.cross_entropy(logits, t, ignore_index=-100)
    else:
        reference = F.cross_entropy(logits, t, ignore_index=-100, reduction="sum") / divisor
    (reference * 3.0).backward()
    torch.testing.assert_close(fused.double(), reference, rtol=1e-6, atol=0)
    for name, mine, theirs in zip(("hidden", "weight", "bias"), leaves, reference_leaves):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-7, msg=f"gradient of {name}")


def test_without_gradients_the_loss_alone_is_computed():
    h, w, b, t = _random_case()
    with torch.no_grad():
        fused = chunked_linear_cross_entropy(h, w, b, t)
    torch.testing.assert_close(fused.double(), F.cross_entropy(F.linear(h, w, b), t), rtol=1e-6, atol=0)


def _losses(model: str, loss: str, tmp_path) -> tuple[list[float], dict]:
    metrics = tmp_path / f"{model}-{loss}.jsonl"
    plan = Plan(device="cpu", batch_size=2, seq_len=32, lr=3e-3, loss=loss)
    train(model, plan=plan, run=RunConfig(steps=20, metrics=str(metrics), seed=0))
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [line["loss"] for line in lines if "step" in line], lines[-1]["summary"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"], ids=["llama", "gpt2-tied-head"])
def test_twenty_steps_follow_the_default_loss_curve(model, tmp_path):
    default, _ = _losses(model, "default", tmp_path)
    fused, summary = _losses(model, "fused", tmp_path)
    assert len(fused) == len(default) == 20
    assert fused == pytest.approx(default, rel=CURVE_TOLERANCE)
    assert default[-1] < default[0] - 0.5  # it learned (builtin corpus): the curve compared is not flat
    assert summary["loss_implementation"] == "pytorch-chunked"


@pytest.mark.parametrize("model, knobs", [("tiny-llama", {}), ("tiny-gpt2", {}), ("tiny-llama", {"precision": "bf16"})],
                         ids=["llama", "gpt2-tied-head", "llama-bf16"])
def test_estimated_peak_matches_a_real_cpu_step(model, knobs):
    plan = Plan(device="cpu", batch_size=2, seq_len=64, loss="fused", **knobs)
    spec = resolve_model(model)
    measured = measure_step(spec, plan).peak_allocated
    predicted = estimate(spec, plan).memory.peak_allocated
    assert abs(predicted - measured) / measured < PEAK_TOLERANCE, (predicted, measured)


@pytest.mark.slow
def test_with_a_large_vocabulary_the_fused_peak_is_lower():
    spec = resolve_model("tiny-llama")
    config = spec.config.__class__.from_dict({**spec.config.to_dict(), "vocab_size": 16384})
    big_vocab = dataclasses.replace(spec, config=config, vocab_size=16384)
    plan = Plan(device="cpu", batch_size=2, seq_len=128)
    default = measure_step(big_vocab, plan).peak_allocated
    fused = measure_step(big_vocab, plan.replace(loss="fused")).peak_allocated
    predicted = estimate(big_vocab, plan.replace(loss="fused")).memory.peak_allocated
    # The default step holds 256 x 16384 float32 logits several times (16 MiB each);
    # the fused one holds one chunk of them and a weight-sized gradient.
    assert fused < 0.8 * default, (fused, default)
    assert abs(predicted - fused) / fused < PEAK_TOLERANCE, (predicted, fused)


@pytest.mark.parametrize("args, says", [
    (["tiny-bert"], "causal-lm"),
    (["tiny-mixtral"], "router loss"),
    (["tiny-llama", "--tp", "2", "--nproc", "2"], "--tp"),
    (["tiny-llama", "--pp", "2", "--nproc", "2"], "--pp"),
], ids=["not-causal-lm", "moe", "tensor-parallel", "pipeline-parallel"])
def test_what_it_cannot_run_is_refused(args, says, capsys, fault_log):
    code = main(["estimate", *args, "--device", "cpu", "--seq-len", "32", "--loss", "fused"])
    err = capsys.readouterr().err
    assert code == 2 and "--loss" in err and says in err, err
    fault_log(kind="bad input", case=f"--loss fused with {' '.join(args)}", exit_code=code, message=err.strip())


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_on_two_processes_follows_the_default_loss_curve(tmp_path):
    """FSDP2 (ZeRO-3, gloo): the head weight is gathered by the root module's hooks and its
    gradient, computed in the fused forward, is reduce-scattered like any other. Both curves
    come from one torchrun launch: each is its own train() call on both ranks."""
    cases = [{"name": loss, "model": "tiny-llama", "steps": 4,
              "knobs": {"batch_size": 2, "seq_len": 32, "zero": 3, "loss": loss}} for loss in ("default", "fused")]
    done = launch(CASES_WORKER, 2, tmp_path, [json.dumps(cases)])
    assert done.returncode == 0, done.stderr[-3000:]
    curves = {}
    for loss in ("default", "fused"):
        trained = done.rank_outputs[0][loss]
        assert "error" not in trained, trained.get("traceback")
        curves[loss] = trained["losses"]
    assert len(curves["fused"]) == 4
    assert curves["fused"] == pytest.approx(curves["default"], rel=CURVE_TOLERANCE)
