"""The CPU's host time per op and arithmetic factor from two reference training steps
(trainwise/bench/calibrate_host.py): step = factor x arithmetic + host x ops."""

from __future__ import annotations

import time

import pytest
import torch

from trainwise.bench.calibrate_host import host_and_factor
from trainwise.bench.calibrate_timing import synchronizer


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


def test_one_cpu_thread_is_timed_by_this_process_cpu_time_which_sleep_does_not_count():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clock = synchronizer(torch.device("cpu")).clock
    finally:
        torch.set_num_threads(threads)
    started = clock()
    time.sleep(0.05)  # another process holding the core looks like this to the timed one
    assert clock() - started < 0.02


def test_matmuls_stay_at_their_rate_and_the_factor_is_fitted_on_the_other_arithmetic():
    # Made with matmuls at their predicted time, the rest x 2.5 and 8 us per op over 700 ops.
    small = {"step_s": 0.0002 + 2.5 * 0.0016 + 700 * 8e-6, "arithmetic_s": 0.0018, "matmul_s": 0.0002, "ops": 700}
    large = {"step_s": 0.030 + 2.5 * 0.025 + 700 * 8e-6, "arithmetic_s": 0.055, "matmul_s": 0.030, "ops": 700}
    host, factor = host_and_factor(small, large)
    assert factor == pytest.approx(2.5) and host == pytest.approx(8e-6)


def test_a_slope_that_leaves_the_host_less_than_a_bare_dispatch_is_noise_the_host_keeps_the_floor():
    small = {"step_s": 0.009, "arithmetic_s": 0.0018, "matmul_s": 0.0002, "ops": 700}
    large = {"step_s": 0.2, "arithmetic_s": 0.014, "matmul_s": 0.0004, "ops": 700}  # a 14x slope: host < 0
    host, factor = host_and_factor(small, large, least_host_s=2e-6)
    assert host == pytest.approx(2e-6)
    assert factor == pytest.approx((0.2 - 0.0004 - 700 * 2e-6) / 0.0136)  # the large step's remainder
