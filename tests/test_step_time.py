"""The step-time model: the traced step's ops, summed by kind, at a device profile's rates.

The op table comes from the memory trace itself (trainwise/trace/op_costs.py); the time
model (trainwise/estimator/step_time.py) prices it. These tests pin what the table counts
(model FLOPs, recomputation), how the time scales (accumulation, depth), how host time
combines with compute on the CPU and on CUDA, and what `estimate` shows."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.estimator.extrapolate import same_timeline
from trainwise.estimator.predict import _trace
from trainwise.estimator.step_time import CATEGORIES, OFF_CRITICAL_PATH, predict_step_time, step_breakdown
from trainwise.hardware import resolve_device
from trainwise.hardware.profile import BYTE_KINDS, DeviceProfile, Rate
from trainwise.models import build_model_with_notes, example_batch, resolve_model
from trainwise.plan.plan import Plan
from trainwise.trace.depth import with_blocks
from trainwise.trace.flops import count_training_flops
from trainwise.trace.op_table import OpCosts

CPU = resolve_device("cpu")
# A made-up CPU: 10 GFLOP/s matmuls, 1 GB/s memory, 10 us to dispatch an op.
PROFILE = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e9, 1e-6), 1e-5)
COMPUTE = ("matmul", "attention", "normalization", "elementwise")


def _plan(**knobs) -> Plan:
    return Plan(**{"device": "cpu", "batch_size": 2, "seq_len": 32, **knobs})


def _spec(blocks: int | None = None, name: str = "tiny-llama"):
    spec = resolve_model(name)
    return spec if blocks is None else dataclasses.replace(spec, config=with_blocks(spec.config, blocks))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_model_flops_of_the_op_table_equal_the_flop_count(attention):
    """Without checkpointing, the matmuls the table saw in forward and backward (plus
    attention as the model counts it) are trainwise/trace/flops.py's model FLOPs."""
    from trainwise.estimator.step_time import _model_flops

    spec, plan = _spec(), _plan(attention=attention)
    costs = _trace(spec, plan, CPU)[0].op_costs
    model = build_model_with_notes(spec, "meta", attention=attention, batch_size=2, seq_len=32).model
    counted = count_training_flops(model, lambda: example_batch(spec, 2, 32, device="cpu"), plan, spec.task,
                                   extrapolate=False)
    assert _model_flops(costs, {0: 1, 1: 0}) == counted.total
    if attention == "eager":  # attention is matmuls too: every FLOP is in the matmul rows
        assert costs.total(1, op_class="matmul", phase="forward") == counted.forward
        assert costs.total(1, op_class="matmul", phase="backward") == counted.backward


def test_recomputation_appears_only_with_checkpointing_and_is_one_forward_of_the_blocks():
    """Checkpointing reruns each block's forward in backward, grad mode on (non-reentrant
    checkpoint on fake tensors). PyTorch stops a block's recomputation once it has rebuilt
    the last tensor backward needs (the block's final projection is not rerun), so the
    recomputed FLOPs are most of the blocks' forward FLOPs, never more."""
    plain = _trace(_spec(3), _plan(), CPU)[0].op_costs
    assert plain.total(0, recomputed=True) == 0
    forward = {n: _trace(_spec(n), _plan(grad_ckpt=True), CPU)[0].op_costs for n in (2, 3)}
    per_block = (forward[3].total(1, phase="forward", op_class="matmul")
                 - forward[2].total(1, phase="forward", op_class="matmul"))
    recomputed = forward[3].total(1, recomputed=True, op_class="matmul")
    assert per_block > 0 and 0.6 * 3 * per_block < recomputed <= 3 * per_block
    assert forward[3].total(1, recomputed=True, op_class="attention") == forward[3].total(
        1, phase="forward", op_class="attention")
    assert forward[3].total(1, phase="forward") == plain.total(1, phase="forward")
    assert estimate(_spec(3), _plan(grad_ckpt=True), profile=PROFILE).time.breakdown["recompute"] > 0


def test_accumulation_scales_forward_and_backward_but_not_the_optimizer():
    two, four = (estimate(_spec(), _plan(grad_accum=n), profile=PROFILE).time for n in (2, 4))
    assert four.breakdown["matmul"] == pytest.approx(2 * two.breakdown["matmul"], rel=1e-9)
    # The first micro-step makes the gradients, later ones add to them: nearly, not exactly, 2x.
    assert four.breakdown["elementwise"] == pytest.approx(2 * two.breakdown["elementwise"], rel=0.1)
    assert four.breakdown["optimizer"] == pytest.approx(two.breakdown["optimizer"], rel=1e-9)
    assert four.samples_per_s == pytest.approx(4 * 2 / four.step_s)


def test_time_extrapolated_from_two_and_three_blocks_equals_a_full_trace():
    spec, plan = _spec(6), _plan()
    extrapolated = estimate(spec, plan, profile=PROFILE)
    assert extrapolated.traced_blocks == (2, 3)
    full = predict_step_time([_trace(spec, plan, CPU)[0]], None, plan, CPU, PROFILE, spec.name)
    assert extrapolated.time.step_s == pytest.approx(full.step_s, rel=0.01)
    for category in COMPUTE + ("optimizer", "host_overhead"):
        assert extrapolated.time.breakdown[category] == pytest.approx(full.breakdown[category], rel=0.01)


def test_the_cpu_adds_host_time_and_cuda_hides_it_behind_the_gpu():
    """One forward of 100 ops: 1 ms of device work, 100 x 20 us = 2 ms of host dispatch."""
    costs = OpCosts({("forward", 0, "elementwise", "fp32", False, 0): [100, 0, 500_000, 500_000]})
    rates = dict(matmul={"fp32": Rate(1e12)}, attention={}, memory=Rate(1e9), host_s_per_op=20e-6)
    cpu = step_breakdown(costs, {0: 1, 1: 0}, _plan(), DeviceProfile("cpu", "cpu", "test", **rates))
    cuda = step_breakdown(costs, {0: 1, 1: 0}, _plan(), DeviceProfile("gpu", "cuda", "test", **rates))
    assert cpu["elementwise"] == pytest.approx(1e-3) and cpu["host_overhead"] == pytest.approx(2e-3)
    assert cuda["elementwise"] == pytest.approx(1e-3) and cuda["host_overhead"] == pytest.approx(1e-3)
    slow_host_free = dataclasses.replace(DeviceProfile("gpu", "cuda", "test", **rates), host_s_per_op=1e-6)
    assert step_breakdown(costs, {0: 1, 1: 0}, _plan(), slow_host_free)["host_overhead"] == 0.0


def test_catalog_h100_estimate_has_a_plausible_mfu_and_a_breakdown_that_adds_up(capsys):
    argv = ["estimate", "Llama-3.2-1B", "--device", "H100", "--precision", "bf16", "--batch-size", "8",
            "--seq-len", "2048", "--grad-accum", "4", "--json"]
    assert main(argv) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    assert {"step_s", "tokens_per_s", "samples_per_s", "mfu", "source", "breakdown", "method"} <= set(time)
    assert set(time["breakdown"]) == set(CATEGORIES) and time["source"] == "catalog"
    assert 0.2 <= time["mfu"] <= 0.8
    on_path = sum(s for name, s in time["breakdown"].items() if name not in OFF_CRITICAL_PATH)
    assert on_path == pytest.approx(time["step_s"])
    assert time["tokens_per_s"] == pytest.approx(8 * 4 * 2048 / time["step_s"])


def test_a_profile_correction_multiplies_the_step_and_is_named():
    corrected = dataclasses.replace(PROFILE, corrections={"step": 2.0, "step:tiny-llama": 1.5})
    plain, scaled = (estimate(_spec(), _plan(), profile=p).time for p in (PROFILE, corrected))
    assert scaled.step_s == pytest.approx(1.5 * plain.step_s) and scaled.correction == 1.5
    assert any("'step:tiny-llama'" in note for note in scaled.notes)


def test_no_time_on_the_cpu_without_a_profile(capsys):
    assert main(["estimate", "tiny-llama", "--device", "cpu", "--seq-len", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"] is None
    assert main(["estimate", "tiny-llama", "--device", "cpu", "--seq-len", "16"]) == 0
    assert "no device profile for cpu: run trainwise calibrate" in " ".join(capsys.readouterr().out.split())


def test_a_profile_file_gives_the_table_its_time(tmp_path, capsys):
    from trainwise.hardware.profile import write_profile

    path = write_profile(PROFILE, tmp_path / "cpu.json")
    assert main(["estimate", "tiny-llama", "--device", "cpu", "--seq-len", "16", "--profile", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Predicted step time on cpu" in out and "one optimizer step" in out and "host/launch overhead" in out


def test_a_catalog_time_says_its_efficiencies_are_assumed(capsys):
    assert main(["estimate", "tiny-llama", "--device", "A100", "--seq-len", "16", "--precision", "bf16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Predicted step time on A100-80GB (seconds, predicted from the traced ops and the catalog figures x " \
           "assumed efficiencies)" in out
    assert main(["estimate", "tiny-llama", "--device", "A100", "--seq-len", "16", "--precision", "bf16", "--json"]) == 0
    assert "catalog figures x assumed efficiencies" in json.loads(capsys.readouterr().out)["time"]["method"]


@pytest.mark.fault
@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"version": 1, "kind": "cpu"})])
def test_a_bad_profile_file_is_refused_naming_the_flag(tmp_path, capsys, content, fault_log):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    code = main(["estimate", "tiny-llama", "--device", "cpu", "--seq-len", "16", "--profile", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --profile"), err
    fault_log(kind="bad input", case=f"estimate --profile <{'missing file' if content is None else content[:20]}>",
              exit_code=2, message=err[0].replace(str(tmp_path), "DIR"))


def test_a_pipeline_layout_times_each_rank_from_its_own_trace():
    """Each pipeline rank runs every chunk of the micro-batch through its half of the
    blocks; the layout's step is the slowest rank's compute plus the bubble and the sends
    between stages (trainwise/estimator/layout_step.py)."""
    whole = estimate(_spec(4), _plan(batch_size=8), profile=PROFILE).time
    piped = estimate(_spec(4), _plan(batch_size=8, nproc=2, pp=2, microbatches=4), profile=PROFILE)
    ranks = [rank["compute_s"] for rank in piped.layout["pipeline_ranks"]]
    assert len(ranks) == 2 and piped.time.step_s > max(ranks)
    assert piped.time.breakdown["pipeline_bubble"] > 0 and piped.time.breakdown["communication_exposed"] > 0
    assert not any("not modelled yet" in note for note in piped.time.notes)
    assert piped.time.samples_per_s == pytest.approx(8 / piped.time.step_s)
    assert piped.time.breakdown["matmul"] < whole.breakdown["matmul"] < 2 * piped.time.breakdown["matmul"]


def test_the_step_compute_factor_slows_every_kernel_but_not_the_host():
    """A training step's kernels run `step_compute_factor` times slower than one kernel
    timed alone; the host's dispatch time is measured in a training step already."""
    costs = OpCosts({("forward", 0, "matmul", "fp32", False, 0): [10, 10**9, 0, 0],
                     ("forward", 0, "elementwise", "fp32", False, 0): [100, 0, 500_000, 500_000],
                     ("optimizer", 0, "elementwise", "fp32", False, 0): [4, 0, 1_000_000, 0]})
    rates = dict(matmul={"fp32": Rate(1e10)}, attention={}, memory=Rate(1e9), host_s_per_op=10e-6)
    plain = step_breakdown(costs, {0: 1, 1: 0}, _plan(), DeviceProfile("cpu", "cpu", "test", **rates))
    slow = step_breakdown(costs, {0: 1, 1: 0}, _plan(),
                          DeviceProfile("cpu", "cpu", "test", **rates, step_compute_factor=1.5))
    for category in ("matmul", "elementwise", "optimizer"):
        assert plain[category] > 0 and slow[category] == pytest.approx(1.5 * plain[category])
    assert slow["host_overhead"] == pytest.approx(plain["host_overhead"]) == pytest.approx(114 * 10e-6)


STEP_COSTS = OpCosts({("forward", 0, "matmul", "fp32", False, 0): [10, 10**9, 0, 0],
                      ("forward", 0, "attention", "fp32", False, 0): [2, 10**8, 0, 0],
                      ("forward", 0, "elementwise", "fp32", False, 0): [100, 0, 500_000, 500_000],
                      ("optimizer", 0, "elementwise", "fp32", False, 0): [4, 0, 1_000_000, 0]})


def test_contractions_and_other_work_have_their_own_step_factors_and_the_host_neither():
    """Calibrate's CPU factors: a step runs its matmuls and attention
    `step_contraction_factor` times slower than timed alone, its element-wise work (and,
    without a measured optimizer rate, the optimizer's) `step_non_matmul_factor` times."""
    plain = step_breakdown(STEP_COSTS, {0: 1, 1: 0}, _plan(), PROFILE)
    slow = step_breakdown(STEP_COSTS, {0: 1, 1: 0}, _plan(),
                          dataclasses.replace(PROFILE, step_contraction_factor=1.3, step_non_matmul_factor=2.0))
    for category, factor in (("matmul", 1.3), ("attention", 1.3), ("elementwise", 2.0), ("optimizer", 2.0)):
        assert plain[category] > 0 and slow[category] == pytest.approx(factor * plain[category]), category
    assert slow["host_overhead"] == pytest.approx(plain["host_overhead"])


def test_the_optimizer_phase_runs_at_the_measured_optimizer_rate_without_the_step_factor():
    """A profile's `optimizer` rate was timed on a real optimizer step: its bytes at that
    rate, not the memory rate, and not slowed again by the element-wise factor."""
    profile = dataclasses.replace(PROFILE, optimizer=Rate(2e8, 5e-6), step_non_matmul_factor=3.0)
    breakdown = step_breakdown(STEP_COSTS, {0: 1, 1: 0}, _plan(), profile)
    assert breakdown["optimizer"] == pytest.approx(4 * 5e-6 + 1e6 / 2e8)
    assert breakdown["elementwise"] == pytest.approx(3.0 * (100 * 1e-6 + 1e6 / 1e9))


def test_an_op_recomputed_by_checkpointing_costs_the_host_its_own_measured_time():
    costs = OpCosts({("forward", 0, "elementwise", "fp32", False, 0): [10, 0, 0, 0],
                     ("backward", 0, "elementwise", "fp32", True, 0): [10, 0, 0, 0],
                     ("backward", 0, "metadata", "fp32", True, 0): [8, 0, 0, 0]})
    same = step_breakdown(costs, {0: 1, 1: 0}, _plan(), PROFILE)
    own = step_breakdown(costs, {0: 1, 1: 0}, _plan(), dataclasses.replace(PROFILE, host_s_per_recomputed_op=4e-5))
    assert same["host_overhead"] == pytest.approx((10 + 10 + 8 / 4) * 1e-5)  # no own figure: a plain op's
    assert own["host_overhead"] == pytest.approx(10 * 1e-5 + (10 + 8 / 4) * 4e-5)  # views a quarter, as ever


def test_an_op_recomputed_under_the_selective_policy_costs_the_host_that_policys_measured_time():
    """Selective checkpointing's policy runs in Python for every op of the block, so its
    recomputed ops carry their own measured host time; full checkpointing keeps its own."""
    costs = OpCosts({("forward", 0, "elementwise", "fp32", False, 0): [10, 0, 0, 0],
                     ("backward", 0, "elementwise", "fp32", True, 0): [10, 0, 0, 0]})
    profile = dataclasses.replace(PROFILE, host_s_per_recomputed_op=4e-5, host_s_per_selective_recomputed_op=9e-5)
    full = step_breakdown(costs, {0: 1, 1: 0}, _plan(grad_ckpt=True), profile)
    selective = step_breakdown(costs, {0: 1, 1: 0}, _plan(grad_ckpt=True, grad_ckpt_policy="selective"), profile)
    older = step_breakdown(costs, {0: 1, 1: 0}, _plan(grad_ckpt=True, grad_ckpt_policy="selective"),
                           dataclasses.replace(profile, host_s_per_selective_recomputed_op=None))
    assert full["host_overhead"] == pytest.approx(10 * 1e-5 + 10 * 4e-5)
    assert selective["host_overhead"] == pytest.approx(10 * 1e-5 + 10 * 9e-5)
    assert older["host_overhead"] == pytest.approx(full["host_overhead"])  # an older profile: full's figure


def test_transcendental_ops_are_elementwise_work_at_the_profiles_own_rate_else_the_memory_rate():
    costs = OpCosts({("forward", 0, "transcendental", "fp32", False, 0): [2, 0, 600_000, 400_000]})
    at_memory = step_breakdown(costs, {0: 1, 1: 0}, _plan(), PROFILE)
    own = step_breakdown(costs, {0: 1, 1: 0}, _plan(), dataclasses.replace(PROFILE, transcendental=Rate(1e8, 0.0)))
    assert at_memory["elementwise"] == pytest.approx(2 * 1e-6 + 1e6 / 1e9)  # no own rate: memory's
    assert own["elementwise"] == pytest.approx(1e6 / 1e8)
    assert own["host_overhead"] == pytest.approx(at_memory["host_overhead"]) == pytest.approx(2 * 1e-5)


def test_softmax_exp_and_activations_are_transcendental_and_plain_arithmetic_is_not():
    import torch

    from trainwise.trace.op_costs import classify

    aten = torch.ops.aten
    for op in (aten._log_softmax.default, aten._log_softmax_backward_data.default, aten.exp.default,
               aten.silu.default, aten.gelu.default, aten.tanh.default):
        assert classify(op) == "transcendental", op
    for op in (aten.add.Tensor, aten.mul.Tensor, aten.tanh_backward.default, aten.sqrt.default):
        assert classify(op) == "elementwise", op


def test_a_traced_llama_step_counts_its_loss_softmax_and_silu_as_transcendental():
    rows = _trace(resolve_model("tiny-llama"), _plan(), CPU)[0].op_costs.rows
    forward = sum(v[0] for k, v in rows.items() if k[0] == "forward" and k[2] == "transcendental")
    backward = sum(v[0] for k, v in rows.items() if k[0] == "backward" and k[2] == "transcendental")
    assert forward >= 3 and backward >= 3  # log-softmax of the loss and one SiLU per block, and their backward


@pytest.mark.parametrize("device", ["cpu", "H100"])
def test_a_fake_tensors_device_answered_by_the_recorder_traces_the_step_the_fake_mode_would(device, monkeypatch):
    """`tensor.device` of a fake tensor is dispatched as an op (most ops of a step: autograd
    asks it for every gradient); the recorder answers it as the fake mode would, and the
    trace, memory and op table are those of the op run through the fake mode."""
    from trainwise.trace import recorder

    plan = _plan(device=device, grad_ckpt=True, grad_accum=2, **({"precision": "bf16"} if device != "cpu" else {}))
    answered = _trace(_spec(3), plan, resolve_device(device))
    monkeypatch.setattr(recorder, "DEVICE_QUERY", None)  # every op through the general path
    dispatched = _trace(_spec(3), plan, resolve_device(device))
    assert same_timeline(answered[0], dispatched[0]) and answered[1] == dispatched[1]
    assert answered[0].op_costs == dispatched[0].op_costs
    metadata = answered[0].op_costs.total(0, op_class="metadata", phase="backward")
    assert metadata > answered[0].op_costs.total(0, phase="backward") / 2, "the device queries are counted"


def test_dropouts_random_numbers_are_priced_at_the_profiles_random_rate_without_the_element_wise_factor():
    """Drawing dropout's mask costs a CPU core ~40x an add per element: at the memory rate
    (the old pricing) a GPT-2 or BERT step with dropout was predicted far too short."""
    costs = OpCosts({("forward", 0, "random", "fp32", False, 0): [2, 0, 500_000, 500_000]})
    slow = dataclasses.replace(PROFILE, step_non_matmul_factor=3.0)
    at_memory = step_breakdown(costs, {0: 1, 1: 0}, _plan(), slow)
    own = step_breakdown(costs, {0: 1, 1: 0}, _plan(), dataclasses.replace(slow, random=Rate(1e8, 0.0)))
    assert at_memory["elementwise"] == pytest.approx(3.0 * (2 * 1e-6 + 1e6 / 1e9))  # no own rate: as before
    assert own["elementwise"] == pytest.approx(1e6 / 1e8)  # the generator's pace, no cold-buffer factor
    assert own["host_overhead"] == pytest.approx(at_memory["host_overhead"]) == pytest.approx(2 * 1e-5)


def test_a_traced_gpt2_step_counts_one_random_mask_per_dropout_and_llama_none():
    import torch

    from trainwise.trace.op_costs import classify

    assert classify(torch.ops.aten.bernoulli_.float) == classify(torch.ops.aten.native_dropout.default) == "random"
    gpt2 = _trace(resolve_model("tiny-gpt2"), _plan(), CPU)[0].op_costs
    llama = _trace(resolve_model("tiny-llama"), _plan(), CPU)[0].op_costs
    layers = resolve_model("tiny-gpt2").config.n_layer
    # Embeddings once; per block the attention probabilities and the two residual branches.
    assert gpt2.total(0, phase="forward", op_class="random") == 1 + 3 * layers
    assert gpt2.total(0, phase="backward", op_class="random") == 0
    assert llama.total(0, op_class="random", phase="forward") == 0


@pytest.mark.parametrize("device,attention", [("cpu", "sdpa"), ("H100", "sdpa"), ("H100", "flash")])
def test_a_traced_llama_step_records_each_attention_kernels_head_dim_and_no_other_op_has_one(device, attention):
    """tiny-llama's heads are 64 / 4 = 16 wide: every attention row, forward and backward,
    says 16 (the kernel's speed on a CPU depends on it), every other row 0; FlashAttention-2's
    (batch, seq, heads, head dim) layout too."""
    plan = _plan(device=device, attention=attention, **({"precision": "bf16"} if device != "cpu" else {}))
    rows = _trace(resolve_model("tiny-llama"), plan, resolve_device(device))[0].op_costs.rows
    attention = {key for key in rows if key[2] == "attention"}
    assert {key[0] for key in attention} == {"forward", "backward"}
    assert {key[5] for key in attention} == {16}
    assert {key[5] for key in rows if key[2] != "attention"} == {0}


def test_a_profile_with_head_dim_rates_prices_a_llama_steps_attention_at_its_head_dims_rate():
    """A CPU runs bf16 attention at head dim 16 at about a third of its rate at 64: a
    profile that measured both prices tiny-llama's (head dim 16) attention at the 16 rate,
    as a profile whose one attention rate were the 16 rate would; an older profile, with
    the 64 rate alone, as before."""
    at_16, at_64 = Rate(1e9, 2e-5), Rate(3e9, 1e-5)
    rates = dict(matmul={"fp32": Rate(1e10, 1e-6), "bf16": Rate(2e10, 1e-6)}, memory=Rate(1e9, 1e-6),
                 host_s_per_op=1e-5)
    plan = _plan(precision="bf16")

    def attention_s(**profile):
        return estimate(_spec(), plan, profile=DeviceProfile("cpu", "cpu", "test", **rates, **profile)).time.breakdown[
            "attention"]

    measured = attention_s(attention={"bf16": at_64}, attention_by_head_dim={"bf16": {16: at_16, 64: at_64}})
    assert measured > 0 and measured == pytest.approx(attention_s(attention={"bf16": at_16}))
    assert attention_s(attention={"bf16": at_64}) < measured / 2  # the old pricing: one rate, head dim 64's


BF16_RATES = {"memory": {"bf16": Rate(5e8)}, "transcendental": {"bf16": Rate(5e7)}, "random": {"bf16": Rate(5e6)}}


def test_a_rows_dtype_picks_its_element_wise_rate_and_the_optimizer_keeps_its_own():
    """A CPU core spends about as long per element on bf16 as on fp32, so per byte bf16 is
    slower: a profile whose bf16 rates are half fp32's prices bf16 element-wise,
    normalisation, transcendental and random rows twice as long, fp32 rows as before, and
    the optimizer phase at its own measured rate whatever the dtype."""
    bf16 = {(phase, 0, op_class, "bf16", False, 0): [0, 0, 600_000, 400_000]
            for phase, op_class in (("forward", "elementwise"), ("forward", "normalization"),
                                    ("backward", "transcendental"), ("forward", "random"))}
    costs = OpCosts({**bf16, ("forward", 0, "elementwise", "fp32", False, 0): [0, 0, 600_000, 400_000],
                     ("optimizer", 0, "elementwise", "bf16", False, 0): [0, 0, 1_000_000, 0]})
    fp32 = dataclasses.replace(PROFILE, memory=Rate(1e9), transcendental=Rate(1e8), random=Rate(1e7),
                               optimizer=Rate(2e8))
    at_fp32 = step_breakdown(costs, {0: 1, 1: 0}, _plan(), fp32)
    own = step_breakdown(costs, {0: 1, 1: 0}, _plan(), dataclasses.replace(fp32, byte_rates_by_dtype=BF16_RATES))
    assert at_fp32["elementwise"] == pytest.approx(1e6 / 1e9 + 1e6 / 1e9 + 1e6 / 1e8 + 1e6 / 1e7)
    assert own["elementwise"] == pytest.approx(1e6 / 1e9 + 2 * (1e6 / 1e9 + 1e6 / 1e8 + 1e6 / 1e7))
    assert own["normalization"] == pytest.approx(2 * at_fp32["normalization"]) == pytest.approx(2e6 / 1e9)
    assert own["optimizer"] == at_fp32["optimizer"] == pytest.approx(1e6 / 2e8)


def test_a_training_steps_slowdown_of_element_wise_work_costs_bf16_bytes_at_fp32s_rate_not_at_bf16s():
    """The step's slowdown beyond its compute factor (step_non_matmul_factor: cold operands,
    fresh buffers, fitted on an fp32 step) is paid per byte at fp32's rate; only the
    cache-hot part is at bf16's own, slower rate. With bf16 half as fast per byte and a
    step 4 x slower than the rates, a bf16 row takes 2 + 3 = 5 units (not 2 x 4 = 8), an
    fp32 row 4, the random rows (their own arithmetic) the compute factor alone."""
    row = [1, 0, 600_000, 400_000]  # one op, 1 MB read + written
    costs = OpCosts({("forward", 0, "elementwise", "bf16", False, 0): row,
                     ("backward", 0, "transcendental", "bf16", False, 1): row,
                     ("forward", 0, "random", "bf16", False, 2): row,
                     ("forward", 0, "elementwise", "fp32", False, 3): row})
    profile = dataclasses.replace(PROFILE, memory=Rate(1e9), transcendental=Rate(1e8), random=Rate(1e7),
                                  step_non_matmul_factor=4.0, step_compute_factor=1.25,
                                  byte_rates_by_dtype=BF16_RATES)
    seconds = step_breakdown(costs, {0: 1, 1: 0}, _plan(), profile)["elementwise"]
    hot = {"memory": 1e6 / 1e9, "transcendental": 1e6 / 1e8}
    assert seconds == pytest.approx(1.25 * ((2 + 3) * hot["memory"] + (2 + 3) * hot["transcendental"]
                                            + 2 * 1e6 / 1e7 + 4 * hot["memory"]))
    # A step no slower than the rates: the dtype's own rate alone, as before.
    level = step_breakdown(costs, {0: 1, 1: 0}, _plan(), dataclasses.replace(profile, step_non_matmul_factor=1.0))
    assert level["elementwise"] == pytest.approx(1.25 * (2 * hot["memory"] + 2 * hot["transcendental"]
                                                         + 2 * 1e6 / 1e7 + hot["memory"]))


def test_a_bf16_plans_element_wise_work_takes_twice_as_long_at_half_the_fp32_byte_rate_and_an_older_profile_says_so():
    """tiny-gpt2 in bf16 on the CPU: its bf16 element-wise rows at a bf16 rate half fp32's
    take twice as long, its fp32 rows (the loss, the optimizer) as long as before. An older
    profile, without a bf16 rate, prices them at fp32's and the estimate says so; a GPU
    profile says nothing (its element-wise kernels move bytes at one rate whatever the dtype)."""
    plan = _plan(precision="bf16")
    traces = [_trace(resolve_model("tiny-gpt2"), plan, CPU)[0]]
    rows = traces[0].op_costs.rows
    bf16_bytes = sum(v[2] + v[3] for k, v in rows.items() if k[3] == "bf16" and k[0] in ("forward", "backward")
                     and k[2] in ("elementwise", "normalization", "transcendental", "random"))
    assert bf16_bytes > 0
    memory = Rate(1e9)
    older = dataclasses.replace(PROFILE, memory=memory, optimizer=Rate(2e8))
    newer = dataclasses.replace(older, byte_rates_by_dtype={kind: {"bf16": Rate(memory.per_s / 2)} for kind in BYTE_KINDS})
    old, new = (predict_step_time(traces, None, plan, CPU, profile, "tiny-gpt2") for profile in (older, newer))
    added = sum(new.breakdown[c] - old.breakdown[c] for c in CATEGORIES)
    assert added == pytest.approx(bf16_bytes / memory.per_s)  # each bf16 byte once more at the fp32 rate
    assert [n for n in old.notes if "bf16 element-wise work" in n] == [
        "bf16 element-wise work (memory, random, transcendental) priced at the fp32 byte rate: assumed, the profile has no "
        "bf16 rate; `trainwise calibrate` measures it"]
    assert not [n for n in new.notes if "element-wise work" in n]
    gpu = predict_step_time(traces, None, plan, CPU, dataclasses.replace(older, kind="cuda"), "tiny-gpt2")
    assert not [n for n in gpu.notes if "element-wise work" in n]


def test_a_fake_tensors_device_query_is_recorded_without_the_general_op_path(monkeypatch):
    """The device queries (most ops of a step) take the op table's short path, which gives
    the rows, eager and compiled, that the general path gives them."""
    from trainwise.estimator.predict import _traced
    from trainwise.trace import op_costs, recorder

    plan = _plan(device="H100", precision="bf16", grad_ckpt=True, grad_accum=2, compile=True)
    seen = []
    general = op_costs.OpCostRecorder.record
    monkeypatch.setattr(op_costs.OpCostRecorder, "record",
                        lambda self, func, *rest: seen.append(func) or general(self, func, *rest))
    short = _traced(_spec(3), plan, resolve_device("H100"), compiled_pricing=True)[0]
    assert seen and recorder.DEVICE_QUERY not in seen
    monkeypatch.setattr(recorder, "DEVICE_QUERY", None)  # every op through the general path
    dispatched = _traced(_spec(3), plan, resolve_device("H100"), compiled_pricing=True)[0]
    assert short.op_costs_by_compile == dispatched.op_costs_by_compile and short.op_costs_by_compile[True]


def test_the_recorders_per_op_lookups_are_made_once_per_op_overload_not_once_per_op(monkeypatch):
    """What the recorder asks of an op that does not change between its calls (its packet:
    is a value asked of it?) is asked once per overload; a single-tensor output is taken as
    it is, without pytree's flattening."""
    import torch
    from torch.utils._pytree import tree_leaves

    from trainwise.trace import recorder
    from trainwise.trace.plain_batch import PlainBatchAnswers

    class Op:  # an op overload as the answers see it, counting the reads of its packet
        reads = 0

        @property
        def overloadpacket(self):
            Op.reads += 1
            return torch.ops.aten.add

        def __call__(self, *args, **kwargs):
            return args

    answers, op = PlainBatchAnswers(), Op()
    for _ in range(100):
        answers.note(op, answers.run(op, (), {}), [])
    assert Op.reads <= 2, "once per overload for run and once for note"
    flattened = []
    monkeypatch.setattr(recorder, "tree_leaves", lambda tree: flattened.append(tree) or tree_leaves(tree))
    trace = _trace(_spec(2), _plan(), CPU)[0]
    ops = sum(row[0] for row in trace.op_costs.rows.values())
    assert ops > 500 and len(flattened) < ops / 10
