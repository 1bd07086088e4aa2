"""--grad-ckpt-policy selective and --grad-ckpt-every K: the same training math as no
checkpointing, less memory than none, more than full checkpointing, predicted by `estimate`
within 3 % of a real CPU step, and refused where they cannot apply."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from memory_reference import measure_step
from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model
from trainwise.techniques.checkpointing import enable_checkpointing
from trainwise.trace.depth import with_blocks

STEPS = 20
# fp32 on the CPU: recomputation reruns the same kernels on the same inputs (dropout masks
# replayed from the saved RNG state), so the losses are expected to be bit-identical; the
# tolerance only leaves room for a kernel that picks another reduction order on rerun.
LOSS_TOLERANCE = 1e-6
PEAK_TOLERANCE = 0.03
VARIANTS = {"none": {}, "full": {"grad_ckpt": True},
            "selective": {"grad_ckpt": True, "grad_ckpt_policy": "selective"},
            "every-2": {"grad_ckpt": True, "grad_ckpt_every": 2}}


@pytest.fixture
def one_thread():
    """Tiny models run 20x faster on one intra-op thread on a shared machine; the math is
    the same for every variant compared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _losses(name: str, **knobs) -> list[float]:
    return list(_cached_losses(name, tuple(sorted(knobs.items()))))


@functools.lru_cache(maxsize=None)
def _cached_losses(name: str, knobs: tuple) -> tuple[float, ...]:
    """Losses of STEPS optimizer steps of the step recipe on fixed random batches (seeded)."""
    plan = Plan(device="cpu", batch_size=1, seq_len=16, lr=3e-3, **dict(knobs))
    spec = resolve_model(name)
    torch.manual_seed(0)
    model = prepare_model(build_model(spec, "cpu", attention=plan.attention), plan,
                          precision_policy(plan.precision, "cpu"), spec.task)
    optimizer = build_optimizer(plan, model, "cpu")
    generator = torch.Generator().manual_seed(1)
    batches = [example_batch(spec, plan.batch_size, plan.seq_len, generator=generator) for _ in range(4)]
    losses = []
    for step in range(STEPS):
        loss = compute_loss(model, batches[step % len(batches)])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return tuple(losses)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])  # gpt2: dropout in every block
@pytest.mark.parametrize("variant", ["selective", "every-2"])
def test_loss_curve_matches_no_checkpointing(name, variant, one_thread):
    plain, checkpointed = _losses(name), _losses(name, **VARIANTS[variant])
    assert plain[-1] < plain[0]  # the run trains
    assert max(abs(a - b) for a, b in zip(plain, checkpointed)) <= LOSS_TOLERANCE, (plain, checkpointed)


def test_selective_with_lora_matches_lora_alone(one_thread):
    lora = {"lora_rank": 4}
    plain = _losses("tiny-llama", **lora)
    assert _losses("tiny-llama", grad_ckpt=True, grad_ckpt_policy="selective", grad_ckpt_every=2, **lora) == \
        pytest.approx(plain, abs=LOSS_TOLERANCE)


def test_every_k_switches_off_the_blocks_in_between():
    spec = dataclasses.replace(resolve_model("tiny-llama"), config=with_blocks(resolve_model("tiny-llama").config, 5))
    model = enable_checkpointing(build_model(spec, "meta"), "selective", every=2)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False, True, False, True]


@functools.lru_cache(maxsize=None)
def _measured_and_predicted(variant: str, blocks: int):
    spec = resolve_model("tiny-llama")
    spec = dataclasses.replace(spec, config=with_blocks(spec.config, blocks))
    plan = Plan.from_dict({"batch_size": 4, "seq_len": 64, "device": "cpu", **VARIANTS[variant]})
    return measure_step(spec, plan), estimate(spec, plan)


# 2 blocks: traced whole; 10 blocks: traced at a few depths and extrapolated (every-2 reads
# checkpointed and kept blocks as two layer kinds).
@pytest.mark.slow
@pytest.mark.parametrize("blocks", [2, 10])
def test_predicted_peak_within_3_percent_and_ordered(blocks):
    peaks = {}
    for variant in VARIANTS:
        measured, result = _measured_and_predicted(variant, blocks)
        error = result.memory.peak_allocated / measured.peak_allocated - 1
        assert abs(error) <= PEAK_TOLERANCE, (variant, measured.peak_allocated, result.memory.peak_allocated)
        # the outputs selective checkpointing keeps count as saved activations, in both
        assert result.memory.activations == pytest.approx(measured.activations, rel=0.02), variant
        peaks[variant] = measured.peak_allocated, result.memory.peak_allocated
    for which in (0, 1):  # measured, then predicted
        peak = {variant: values[which] for variant, values in peaks.items()}
        assert peak["none"] > peak["every-2"] > peak["full"]
        assert peak["none"] > peak["selective"] > peak["full"]
    activations = {variant: _measured_and_predicted(variant, blocks)[0].activations for variant in VARIANTS}
    assert activations["none"] > activations["selective"] > activations["full"]
    assert _measured_and_predicted("every-2", blocks)[1].extrapolation == (None if blocks == 2 else "per-kind")


@pytest.mark.fault
@pytest.mark.parametrize("flags, flag", [(["--grad-ckpt-policy", "selective"], "--grad-ckpt-policy"),
                                         (["--grad-ckpt-every", "2"], "--grad-ckpt-every"),
                                         (["--grad-ckpt", "--grad-ckpt-every", "0"], "--grad-ckpt-every"),
                                         (["--grad-ckpt", "--grad-ckpt-policy", "ops"], "--grad-ckpt-policy"),
                                         (["--grad-ckpt", "--grad-ckpt-every", "2", "--nproc", "2", "--pp", "2"],
                                          "--grad-ckpt-every")])
def test_shaping_checkpointing_without_it_or_with_bad_values_is_refused(flags, flag, capsys, fault_log):
    code = main(["estimate", "tiny-llama", "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert f"trainwise: error: {flag}:" in err
    fault_log(kind="bad input", case=f"estimate {' '.join(flags)}", exit_code=code, message=err.strip())


class _Blocks(torch.nn.Module):
    """A model with no checkpointing switch of its own: its blocks are wrapped instead."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().sum()


def test_a_model_without_a_switch_has_every_kth_block_wrapped_and_the_same_gradients():
    torch.manual_seed(0)
    plain = _Blocks()
    torch.manual_seed(0)
    checkpointed = enable_checkpointing(_Blocks(), "selective", every=2)
    assert [isinstance(block.forward, functools.partial) for block in checkpointed.blocks] == [True, False, True]
    x = torch.randn(4, 8)
    plain(x).backward()
    checkpointed(x).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), checkpointed.parameters()))


class _TwoStacks(torch.nn.Module):
    """An encoder-decoder shape without a switch of its own: two stacks of blocks, the
    longest ModuleList being neither (a block's three sublayers)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.decoder = torch.nn.ModuleList(_Blocks() for _ in range(2))

    def forward(self, x):
        for block in self.encoder:
            x = block(x)
        return sum(block(x) for block in self.decoder)


def test_a_model_without_a_switch_has_the_blocks_of_every_stack_wrapped_counted_within_each():
    from trainwise.trace.blocks import BlockTracker

    model = enable_checkpointing(_TwoStacks(), "full", every=1)
    wrapped = [m for m in model.modules() if isinstance(m.__dict__.get("forward"), functools.partial)]
    assert wrapped == [*model.encoder, *model.decoder] == BlockTracker(model).modules  # the trace's blocks
    every_other = enable_checkpointing(_TwoStacks(), "full", every=2)
    assert [isinstance(b.__dict__.get("forward"), functools.partial)
            for b in (*every_other.encoder, *every_other.decoder)] == [True, False, True, False]
