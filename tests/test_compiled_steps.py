"""The compiled kernel's and region call's host time, fitted on the reference model's own
compiled training steps (trainwise/calibration/compiled_steps.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainwise.calibration import compiled_steps
from trainwise.calibration.compiled_steps import kernel_and_region_host
from trainwise.hardware.profile import DeviceProfile, Rate


def _step(kernels: float, calls: float, kernel_s: float, region_s: float, noise_s: float = 0.0) -> dict:
    """A compiled step whose measured rise over the plain one is the predicted rise without
    compiled host time plus `kernels` x `kernel_s` + `calls` x `region_s` (+ noise)."""
    plain, free = 0.004, 0.0025
    return {"predicted_plain_s": plain, "predicted_without_compiled_host_s": free, "kernels": kernels,
            "region_calls": calls, "measured_rise_s": (free - plain) + kernels * kernel_s + calls * region_s + noise_s}


def test_the_two_compiled_steps_give_the_kernels_and_the_region_calls_host_time():
    """Per block: 288 kernels and 16 region calls; whole: 287 and 2 (tiny-llama at 8 blocks, 2 x 64)."""
    found = kernel_and_region_host([_step(288, 16, 9e-6, 67e-6), _step(287, 2, 9e-6, 67e-6)], 0.3e-6, 36e-6)
    assert found["kernel_s"] == pytest.approx(9e-6) and found["region_s"] == pytest.approx(67e-6)
    assert "why" not in found


def test_a_pair_that_is_not_positive_holds_one_figure_at_the_chains():
    """Noise that makes the region call's figure negative: the kernel's is read from the
    step compiled whole (two region calls, at the chain's figure), the region's left None."""
    steps = [_step(72, 4, 9e-6, 110e-6, noise_s=-0.0012), _step(77, 2, 9e-6, 110e-6)]
    found = kernel_and_region_host(steps, 0.3e-6, 36e-6)
    assert found["region_s"] is None and "chain's" in found["why"]
    assert found["kernel_s"] == pytest.approx((77 * 9e-6 + 2 * 110e-6 - 2 * 36e-6) / 77)


def test_compiled_steps_no_slower_than_predicted_leave_the_chains_figures():
    steps = [_step(72, 4, 0.0, 0.0, noise_s=-0.001), _step(77, 2, 0.0, 0.0, noise_s=-0.001)]
    found = kernel_and_region_host(steps, 0.3e-6, 36e-6)
    assert found["kernel_s"] is None and found["region_s"] is None and "stand" in found["why"]


def _cpu_profile(**fields) -> DeviceProfile:
    base = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e10, 1e-6), 5e-6,
                         host_s_per_compiled_kernel=0.3e-6, host_s_per_compiled_region=36e-6)
    return dataclasses.replace(base, **fields)


def test_calibrate_prices_compiled_steps_with_the_fitted_figures_and_keeps_the_chains_where_none(monkeypatch):
    """On the CPU the steps' figures replace the chain's where fitted; --quick measures neither."""
    from trainwise.api import calibrate
    from trainwise.calibration import compiled_host
    from trainwise.calibration.timing import FULL, QUICK

    chain = {"kernel_s": 0.3e-6, "region_s": 36e-6, "points": []}
    found = {"kernel_s": 9e-6, "region_s": None, "why": "no positive pair", "steps": []}
    monkeypatch.setattr(compiled_host, "measure_compiled_host", lambda device, profile, settings: chain)
    monkeypatch.setattr(compiled_steps, "measure_compiled_steps", lambda device, profile, settings: found)
    full = calibrate._with_compiled_host(_cpu_profile(measured={}), torch.device("cpu"), FULL)
    assert full.host_s_per_compiled_kernel == 9e-6 and full.host_s_per_compiled_region == 36e-6
    assert full.measured["compiled_steps"] is found and full.measured["compiled_host"] is chain
    quick = calibrate._with_compiled_host(_cpu_profile(measured={}), torch.device("cpu"), QUICK)
    assert quick.host_s_per_compiled_kernel == 0.3e-6 and "--quick" in quick.measured["compiled_steps"]["why"]


def test_a_machine_where_torch_compile_fails_fits_nothing(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("InductorError: CppCompileError: no C++ compiler found\nmore")
    monkeypatch.setattr(torch, "compile", no_compiler)
    from trainwise.calibration.timing import QUICK

    found = compiled_steps.measure_compiled_steps(torch.device("cpu"), _cpu_profile(), QUICK)
    assert found["kernel_s"] is None and found["region_s"] is None and found["steps"] == []
    assert found["why"].startswith("torch.compile failed on this machine (RuntimeError: InductorError")


@pytest.mark.slow
def test_the_reference_models_compiled_steps_are_timed_on_the_cpu(tmp_path, monkeypatch):
    """Compiles tiny-llama per block and whole (tens of seconds): both steps were compiled
    (Dynamo captured graphs), each is counted with its kernels and region calls (the model
    deepened to BLOCKS: two calls a block per block, two whole), and whatever the figures
    read on a shared machine,
    they are positive or None with why."""
    from torch._dynamo.utils import counters

    from trainwise.calibration.timing import QUICK

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    counters.clear()
    profile = _cpu_profile(matmul={"fp32": Rate(2e10, 3e-6)}, memory=Rate(5e9, 2e-6))
    found = compiled_steps.measure_compiled_steps(torch.device("cpu"), profile, QUICK)
    assert "failed" not in found.get("why", ""), found.get("why")
    assert counters["stats"]["unique_graphs"] >= 2
    by_scope = {step["scope"]: step for step in found["steps"]}
    assert by_scope["blocks"]["region_calls"] == pytest.approx(2 * compiled_steps.BLOCKS)
    assert by_scope["model"]["region_calls"] == pytest.approx(2)
    assert all(step["kernels"] > 0 and step["step_s"] > 0 and step["plain_step_s"] > 0 for step in found["steps"])
    for key in ("kernel_s", "region_s"):
        assert found[key] is None or found[key] > 0
    assert found.get("why") or (found["kernel_s"] and found["region_s"])
