"""The CPU's host time per op and arithmetic factor from two reference training steps
(trainwise/calibration/host_time.py): step = factor x arithmetic + host x ops."""

from __future__ import annotations


import pytest
import torch

from trainwise.calibration.host_time import host_and_factor


def test_two_reference_steps_give_the_host_time_per_op_and_the_factor():
    # Made with factor 2 and 10 us per op over 700 ops.
    small = {"step_s": 2 * 0.001 + 700 * 10e-6, "arithmetic_s": 0.001, "ops": 700}
    large = {"step_s": 2 * 0.010 + 700 * 10e-6, "arithmetic_s": 0.010, "ops": 700}
    host, factor = host_and_factor(small, large)
    assert factor == pytest.approx(2.0) and host == pytest.approx(10e-6)


def test_a_step_faster_than_its_kernels_alone_is_read_as_noise_not_a_factor_below_one():
    small = {"step_s": 0.008, "arithmetic_s": 0.001, "ops": 700}
    large = {"step_s": 0.0125, "arithmetic_s": 0.010, "ops": 700}
    host, factor = host_and_factor(small, large)
    assert factor == 1.0 and host == pytest.approx(0.007 / 700)


def test_work_priced_by_other_means_stays_and_the_factor_is_fitted_on_the_other_arithmetic():
    # Made with contractions and optimizer at their predicted time, the rest x 2.5 and 8 us per op over 700 ops.
    small = {"step_s": 0.0002 + 2.5 * 0.0016 + 700 * 8e-6, "arithmetic_s": 0.0018, "fixed_s": 0.0002, "ops": 700}
    large = {"step_s": 0.030 + 2.5 * 0.025 + 700 * 8e-6, "arithmetic_s": 0.055, "fixed_s": 0.030, "ops": 700}
    host, factor = host_and_factor(small, large)
    assert factor == pytest.approx(2.5) and host == pytest.approx(8e-6)


def test_a_slope_that_leaves_the_host_less_than_a_bare_dispatch_is_noise_the_host_keeps_the_floor():
    small = {"step_s": 0.009, "arithmetic_s": 0.0018, "fixed_s": 0.0002, "ops": 700}
    large = {"step_s": 0.2, "arithmetic_s": 0.014, "fixed_s": 0.0004, "ops": 700}  # a 14x slope: host < 0
    host, factor = host_and_factor(small, large, least_host_s=2e-6)
    assert host == pytest.approx(2e-6)
    assert factor == pytest.approx((0.2 - 0.0004 - 700 * 2e-6) / 0.0136)  # the large step's remainder


def test_a_step_measured_faster_than_its_hot_kernels_is_held_at_a_factor_of_one():
    """Below 1 the slope is noise (a step's kernels do not beat the same kernels hot): the
    factor is 1 and the host time per op is what the small step leaves at that factor."""
    small = {"step_s": 0.010, "arithmetic_s": 0.002, "ops": 1000}
    large = {"step_s": 0.015, "arithmetic_s": 0.012, "ops": 1000}  # a slope of 0.5
    host, factor = host_and_factor(small, large)
    assert factor == 1.0
    assert host == pytest.approx((0.010 - 0.002) / 1000)
    steep = {"step_s": 0.030, "arithmetic_s": 0.012, "ops": 1000}  # a slope of 2 is kept
    assert host_and_factor(small, steep)[1] == pytest.approx(2.0)


def test_a_contraction_ratio_below_one_is_held_at_one_and_recorded_as_measured():
    from trainwise.calibration.replay import contraction_from

    assert contraction_from(in_step_s=0.8, replayed_s=1.0) == (1.0, pytest.approx(0.8))
    assert contraction_from(in_step_s=1.5, replayed_s=1.0) == (pytest.approx(1.5), pytest.approx(1.5))
    assert contraction_from(in_step_s=0.5, replayed_s=0.0) == (1.0, 1.0)  # nothing replayed: no evidence


def test_the_contraction_factor_times_exactly_the_steps_matmul_and_attention_ops():
    """Each matmul and attention op of the reference step, timed in the step and replayed
    hot; the factor is their ratio, never below 1 (a step does not beat hot operands)."""
    from trainwise.calibration.replay import contraction_factor
    from trainwise.estimator.predict import _trace
    from trainwise.hardware import resolve_device
    from trainwise.models import resolve_model
    from trainwise.plan.plan import Plan

    plan = Plan(batch_size=1, seq_len=16, device="cpu")
    factor, found = contraction_factor(torch.device("cpu"), plan)
    rows = _trace(resolve_model("tiny-llama"), plan, resolve_device("cpu"))[0].op_costs.rows
    traced = sum(v[0] for k, v in rows.items() if k[2] in ("matmul", "attention") and k[0] in ("forward", "backward"))
    assert found["ops"] == traced
    assert found["in_step_s"] > 0 and found["replayed_s"] > 0
    assert factor == max(1.0, found["ratio"])


def test_the_optimizer_rate_is_on_the_bytes_the_trace_counts_for_an_adamw_step():
    """AdamW's foreach ops read and write far more than the 28 bytes per parameter its
    state needs; the optimizer rate is on the bytes the trace counts, so it prices a
    traced optimizer phase."""
    from trainwise.calibration.memory import traced_work

    params = [torch.nn.Parameter(torch.rand(1000)) for _ in range(4)]
    for p in params:
        p.grad = torch.rand_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    optimizer.step()
    moved, kernels = traced_work(optimizer.step)
    assert moved > 28 * 4000 and moved % 4 == 0 and kernels >= 5


def test_the_reference_step_reads_nothing_back_as_trainwise_loop_between_log_steps():
    # The step that prices the host time per op runs as the training loop does between
    # read points: the loss and the gradient norm stay tensors (no .item() in trainwise).
    from test_lazy_step_reads import TrainwiseScalarReads

    from trainwise.calibration.host_time import reference_step
    from trainwise.plan.plan import Plan

    one_step = reference_step(torch.device("cpu"), Plan(batch_size=1, seq_len=8, device="cpu"))
    with TrainwiseScalarReads() as reads:
        one_step()
        one_step()
    assert reads.count == 0


class _FakeSteps:
    """Training steps of a fake duration on a fake clock: the plain steps at 1 x 8 and
    8 x 256 tokens (the host/factor fit), plain steps at any other size, and checkpointed
    steps under each policy; each call recorded by what it ran."""

    SECONDS = {"host bound": 0.002, "compute bound": 0.050, "plain": 0.010, "full": 0.014, "selective": 0.013}

    def __init__(self):
        self.now, self.calls = 0.0, []

    def kind(self, plan) -> str:
        if plan.grad_ckpt:
            return plan.grad_ckpt_policy
        return {(1, 8): "host bound", (8, 256): "compute bound"}.get((plan.batch_size, plan.seq_len), "plain")

    def reference_step(self, device, plan, model=None):
        def one_step():
            self.calls.append(self.kind(plan))
            self.now += self.SECONDS[self.kind(plan)]
        return one_step


def _stub_measurement(monkeypatch, fake: _FakeSteps) -> None:
    """The reference steps on `fake`'s clock, and a time model that prices the plain 2 x 64
    step 4 ms low (6 ms, measured 10 ms), each checkpointed one without its recomputed ops'
    host time 2 ms (full: 100 ops) or 1 ms (selective: 80 ops) above the plain prediction."""
    from types import SimpleNamespace

    from trainwise.calibration import host_time, replay

    predicted = {"plain": (0.006, 0), "full": (0.008, 100), "selective": (0.007, 80)}
    fields = {"full": "host_s_per_recomputed_op", "selective": "host_s_per_selective_recomputed_op"}

    def priced(plan, device, profiles, model=None):
        free, ops = predicted[fake.kind(plan)]
        host = [getattr(p, fields[fake.kind(plan)]) or 0.0 if plan.grad_ckpt else 0.0 for p in profiles]
        return [SimpleNamespace(time=SimpleNamespace(step_s=free + h * ops)) for h in host]

    def compute_and_ops(plan, device, measured):  # the host/factor fit: 1 ms and 45 ms of arithmetic, 100 ops
        return (0.001 if plan.batch_size == 1 else 0.045), 0.0, 100.0

    monkeypatch.setattr(host_time, "reference_step", fake.reference_step)
    monkeypatch.setattr(host_time, "clock_of", lambda sync: lambda: fake.now)
    monkeypatch.setattr(host_time, "priced_under_profiles", priced)
    monkeypatch.setattr(host_time, "predicted_compute_and_ops", compute_and_ops)
    monkeypatch.setattr(replay, "contraction_factor", lambda device, plan: (1.0, {"ratio": 1.0}))


def test_a_recomputed_ops_host_time_is_what_checkpointing_adds_to_the_measured_plain_step(monkeypatch):
    """The figure is the checkpointed step less the plain one, both measured, less the
    predicted rise, over the recomputed ops: full (14 - 10 - 2) ms / 100 = 20 us, selective
    (13 - 10 - 1) ms / 80 = 25 us. The checkpointed step less its own prediction (the old
    formula) put the 4 ms the model misses on the plain step onto the recomputed ops:
    (14 - 8) / 100 = 60 us and (13 - 7) / 80 = 75 us."""
    from trainwise.calibration.host_time import measure_training_host
    from trainwise.calibration.timing import QUICK
    from trainwise.hardware.profile import DeviceProfile, Rate

    fake = _FakeSteps()
    _stub_measurement(monkeypatch, fake)
    measured = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e9, 1e-6), 2e-6)
    fitted, found = measure_training_host(torch.device("cpu"), measured, QUICK)
    assert fitted.host_s_per_op < 20e-6  # the floor below: not what sets the figures
    assert fitted.host_s_per_recomputed_op == pytest.approx(20e-6)
    assert fitted.host_s_per_selective_recomputed_op == pytest.approx(25e-6)
    full = found["recomputed"]
    assert full["measured_rise_s"] == pytest.approx(0.004) and full["plain_step_s"] == pytest.approx(0.010)
    assert full["recomputed_ops"] == 100 and full["host_s_per_recomputed_op"] == fitted.host_s_per_recomputed_op


def test_the_plain_and_checkpointed_steps_are_timed_in_interleaved_blocks(monkeypatch):
    # A load that comes and goes must hit the steps compared alike: after the warm-up the
    # plans take turns block by block, several times over, not one plan's steps then another's.
    from trainwise.calibration.host_time import measure_training_host
    from trainwise.calibration.timing import QUICK
    from trainwise.hardware.profile import DeviceProfile, Rate

    fake = _FakeSteps()
    _stub_measurement(monkeypatch, fake)
    measured = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e9, 1e-6), 2e-6)
    measure_training_host(torch.device("cpu"), measured, QUICK)
    compared = [kind for kind in fake.calls if kind in ("plain", "full", "selective")]
    runs = [kind for i, kind in enumerate(compared) if i == 0 or compared[i - 1] != kind]
    assert runs[3:9] == ["plain", "full", "selective"] * 2  # past the warm-up, in turn
    assert runs.count("plain") >= 4 and runs.count("full") == runs.count("plain")


def test_the_recomputed_host_time_holds_at_a_plain_ops_when_checkpointing_adds_less_than_predicted():
    from trainwise.calibration.host_time import recomputed_op_host

    assert recomputed_op_host(0.004, 0.002, 100, 2e-6) == pytest.approx(20e-6)
    assert recomputed_op_host(0.001, 0.002, 100, 2e-6) == 2e-6  # measured below predicted: noise
    assert recomputed_op_host(0.004, 0.002, 0, 2e-6) == 2e-6  # nothing recomputed


def test_the_two_reference_steps_are_timed_in_turn_so_a_change_of_speed_meets_both(monkeypatch):
    """The factor is set by the difference of the two reference steps: timed one after the
    other on a VM whose speed moves, they met two speeds (two quiet calibrations ten
    minutes apart fitted 2.97 and 7.84). Past the warm-up, their blocks alternate."""
    from trainwise.calibration.host_time import REFERENCE_BLOCKS, measure_training_host
    from trainwise.calibration.timing import QUICK
    from trainwise.hardware.profile import DeviceProfile, Rate

    fake = _FakeSteps()
    _stub_measurement(monkeypatch, fake)
    measured = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e9, 1e-6), 2e-6)
    _, found = measure_training_host(torch.device("cpu"), measured, QUICK)
    fitted = [kind for kind in fake.calls if kind in ("host bound", "compute bound")]
    runs = [kind for i, kind in enumerate(fitted) if i == 0 or fitted[i - 1] != kind]
    assert runs[2:] == ["host bound", "compute bound"] * REFERENCE_BLOCKS  # after each one's warm-up
    assert [p["step_s"] for p in found["steps"]] == pytest.approx([0.002, 0.050])


def test_calibrate_times_the_reference_steps_between_its_rate_measurements(monkeypatch):
    """A VM's speed moves over tens of seconds: steps timed in one spell and rates in
    another put the whole change on the element-wise factor. calibrate takes a block of the
    reference steps before its first rate measurement and after each group of them."""
    from trainwise.api import calibrate
    from trainwise.calibration import compute, memory
    from trainwise.calibration.timing import QUICK, Fit
    from trainwise.hardware.profile import Rate

    order = []

    def measured(name, value):
        def fake(*args, **kwargs):
            order.append(name)
            return value
        return fake

    fit = Fit(Rate(1e10, 1e-6), [(1.0, 1e-6)], 0.0)
    monkeypatch.setattr(compute, "dtypes_to_measure", lambda device: ["fp32", "bf16"])
    monkeypatch.setattr(compute, "measure_matmul", measured("matmul", fit))
    monkeypatch.setattr(compute, "measure_attention", measured("attention", dict.fromkeys(compute.HEAD_DIMS, fit)))
    monkeypatch.setattr(memory, "measure_bytes", measured("bytes", fit))
    monkeypatch.setattr(memory, "measure_bytes_relative", measured("relative", (1.5, {"ratio": 1.5, "spread": 0.0})))
    monkeypatch.setattr(memory, "measure_optimizer", measured("optimizer", fit))
    monkeypatch.setattr(memory, "measure_host_overhead", measured("host", (5e-6, 0.0)))
    calibrate._measure_one_device(torch.device("cpu"), QUICK, between=lambda: order.append("steps"))
    assert order[0] == "steps" and order[-1] == "steps"
    assert order.count("steps") >= 6  # per dtype, per kind of element-wise op, the dtype ratios, the optimizer
    gaps = [len(list(group)) for key, group in __import__("itertools").groupby(order, lambda n: n == "steps") if not key]
    assert max(gaps) <= 3  # no long run of rates without the steps
