"""--activation-offload: the blocks' saved tensors go to host memory in forward and come
back for backward (trainwise/techniques/activation_offload.py).

On the CPU nothing moves (host memory is where the tensors are), so besides the real CPU
run, the loss curves are also checked with the offloader told to treat the CPU as a
device: every copy out and back is then really made, on the CPU, by the code the CUDA
path runs apart from its streams."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.estimator.activation_offload_time import OffloadTraffic, activation_offload_seconds
from trainwise.hardware.profile import DeviceProfile, Rate
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model
from trainwise.techniques.activation_offload import OFFLOADER_ATTRIBUTE, enable_activation_offload, from_parameter

STEPS = 20
# fp32 on one thread order: the copies are bit-exact, so the curves are equal.
LOSS_TOLERANCE = 0.0


def _recipe_losses(knobs: dict, copies: bool, steps: int) -> tuple[list[float], int]:
    """Losses of `steps` optimizer steps of tiny-llama through the step recipe, and the
    bytes the offloader copied (every saved tensor worth moving when `copies`)."""
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")
    plan = Plan.from_dict({"batch_size": 2, "seq_len": 16, "device": "cpu", **knobs})
    model = prepare_model(build_model(spec, "cpu"), plan, precision_policy("fp32", "cpu"), spec.task)
    offloader = getattr(model, OFFLOADER_ATTRIBUTE, None)
    if offloader is not None and copies:
        offloader.simulate_device_type, offloader.min_bytes = "cuda", 0
    optimizer = build_optimizer(plan, model, "cpu")
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = compute_loss(model, example_batch(spec, 2, 16, device="cpu"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, offloader.moved_bytes if offloader is not None else 0


@pytest.mark.parametrize("knobs, steps", [pytest.param({}, STEPS, marks=pytest.mark.slow), ({"grad_ckpt": True}, 4),
                                          ({"lora_rank": 4}, 4)],
                         ids=["plain", "grad-ckpt", "lora"])
def test_copied_out_and_back_the_loss_curve_is_unchanged(knobs, steps):
    plain, _ = _recipe_losses(knobs, False, steps)
    offloaded, moved = _recipe_losses({**knobs, "activation_offload": True}, True, steps)
    assert moved > 0
    assert max(abs(a - b) for a, b in zip(plain, offloaded)) <= LOSS_TOLERANCE, (plain, offloaded)
    if knobs.get("grad_ckpt"):
        # Checkpointed blocks keep only their input (2 x 16 x 64 fp32 hidden states in
        # each of tiny-llama's 2 blocks): the recomputed internals are not copied.
        assert moved == steps * 2 * (2 * 16 * 64 * 4)


def test_parameters_and_what_views_or_casts_make_of_them_are_not_copied():
    weight = nn.Parameter(torch.randn(8, 8))
    activation = torch.randn(4, 8, requires_grad=True) @ weight
    assert from_parameter(weight) and from_parameter(weight.t()) and from_parameter(weight.to(torch.bfloat16).t())
    assert not from_parameter(activation) and not from_parameter(activation.t())


def test_of_a_stack_of_linear_blocks_only_the_inputs_move():
    """Each Linear saves its input and its weight: the input (8 x 64 fp32) moves, the
    weight (64 x 64) does not."""
    blocks = nn.ModuleList(nn.Linear(64, 64, bias=False) for _ in range(3))
    model = nn.Sequential(*blocks)
    offloader = enable_activation_offload(model, blocks)
    offloader.simulate_device_type, offloader.min_bytes = "cuda", 0
    leaf = torch.randn(8, 64, requires_grad=True)
    model(leaf * 2).square().sum().backward()  # a computed input: a leaf would count as a parameter
    assert offloader.moved_bytes == 3 * 8 * 64 * 4
    assert leaf.grad is not None


@pytest.mark.fault
def test_on_cpu_it_is_refused_as_a_no_op_for_estimate_and_train(tmp_path, capsys, fault_log):
    for command in ("estimate", "train"):
        argv = [command, "tiny-llama", "--device", "cpu", "--seq-len", "16", "--activation-offload"]
        code = main([*argv, *(["--out", str(tmp_path / "out")] if command == "train" else [])])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (code, err)
        assert err[0].startswith("trainwise: error: --activation-offload") and "on cpu" in err[0]
        assert not (tmp_path / "out").exists()
        fault_log(kind="bad input", case=f"{command} --device cpu --activation-offload (a no-op there)", exit_code=2,
                  message=err[0])


def _h100(**knobs):
    plan = Plan.from_dict({"batch_size": 8, "seq_len": 256, "device": "H100-SXM", "precision": "bf16", **knobs})
    return estimate("tiny-llama", plan)


def test_for_an_h100_the_blocks_saved_tensors_leave_the_device_for_the_host():
    """The host figure is about the saved activations made in the blocks (not the
    embeddings', head's or loss's; it gains block 0's input, made by the embedding, and
    loses the last block's output, which the final norm saves outside any block; the bf16
    weight copies stay); the device's saved activations and its peak drop by about as much
    (the peak holds the copies backward brings back for one block and the one prefetched)."""
    plain, offloaded = _h100(), _h100(activation_offload=True)
    in_blocks = sum(b for module, b in plain.activations_by_module.items() if module.startswith("model.layers."))
    host = offloaded.memory.host
    assert plain.memory.host == 0 and abs(host - in_blocks) <= 0.05 * in_blocks
    assert abs((plain.memory.activations - offloaded.memory.activations) - host) <= 0.05 * host
    assert 0.9 * host <= plain.memory.peak_allocated - offloaded.memory.peak_allocated <= 1.02 * host
    assert offloaded.time.breakdown["offload"] > 0 and plain.time.breakdown["offload"] == 0


def test_transfers_are_exposed_only_beyond_the_compute_they_overlap():
    """1 GB/s: 1 s each way. Forward (2 s) hides the copies out; the first block of backward
    (0.25 s) waits; the rest (0.75 s) hides under a 2 s backward, not under a 0.5 s one."""
    profile = DeviceProfile("a GPU", "cuda", "test", {}, {}, Rate(1e12), 0.0, host_to_device=Rate(1e9))
    traffic = OffloadTraffic(per_micro_batch=10**9, last_block=250_000_000)
    hidden, _ = activation_offload_seconds(traffic, {"forward": 2.0, "backward": 2.0}, 1, profile)
    assert hidden == pytest.approx(0.25)
    exposed, _ = activation_offload_seconds(traffic, {"forward": 0.5, "backward": 0.5}, 2, profile)
    assert exposed == pytest.approx(2 * (0.5 + 0.25 + 0.25))
    on_the_cpu, note = activation_offload_seconds(traffic, {"forward": 0.5}, 1, dataclasses.replace(
        profile, kind="cpu", host_to_device=None))
    assert on_the_cpu == 0.0 and "nothing moves" in note


@pytest.mark.fault
@pytest.mark.parametrize("command, flags", [
    ("estimate", ["--device", "H100-SXM", "--tp", "2"]),
    ("estimate", ["--device", "H100-SXM", "--pp", "2"]),
    ("estimate", ["--device", "H100-SXM", "--fsdp", "2"]),
    ("train", ["--device", "cpu", "--compile", "--steps", "1", "--data", "synthetic"]),
])
def test_layouts_and_compile_it_does_not_support_are_refused_with_exit_2(command, flags, tmp_path, capsys, fault_log):
    argv = [command, "tiny-llama", "--seq-len", "16", "--batch-size", "1", *flags, "--activation-offload"]
    if command == "train":
        argv += ["--output", str(tmp_path / "out")]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --activation-offload"), (code, err)
    assert not (tmp_path / "out").exists()
    fault_log(kind="bad input", case=f"{command} tiny-llama {' '.join(flags)} --activation-offload", exit_code=2,
              message=err[0].replace(str(tmp_path), "DIR"))


def test_the_default_bench_ladder_has_an_activation_offload_rung():
    from trainwise.bench.ladders import load_ladder

    rungs = {r.name: r.plan for r in load_ladder("default", {"device": "cuda"})}
    assert rungs["activation offload"].activation_offload


def test_an_encoder_decoders_blocks_of_both_stacks_run_under_the_offloader():
    """tiny-t5's encoder and decoder blocks, the blocks the trace prices (not the longest
    ModuleList: one decoder block's three sublayers)."""
    from trainwise.trace.blocks import BlockTracker

    spec = resolve_model("tiny-t5")
    model = prepare_model(build_model(spec, "meta"), Plan(device="cpu", activation_offload=True),
                          precision_policy("fp32", "cpu"), spec.task)
    offloaded = [m for m in model.modules() if hasattr(m.__dict__.get("forward"), "__wrapped__")]  # functools.wraps
    assert offloaded == [*model.encoder.block, *model.decoder.block] == BlockTracker(model).modules
