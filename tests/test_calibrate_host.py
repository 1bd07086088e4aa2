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


def test_a_larger_step_slowed_by_other_work_still_leaves_the_small_step_its_host_time():
    # The larger step took 130x its arithmetic (another process ran): the two-point slope
    # would leave the small step negative host time; read it at factor 1 instead.
    small = {"step_s": 0.008, "arithmetic_s": 0.001, "ops": 700}
    large = {"step_s": 1.3, "arithmetic_s": 0.010, "ops": 700}
    host, factor = host_and_factor(small, large)
    assert host == pytest.approx(0.007 / 700)
    assert factor == pytest.approx((1.3 - 0.007) / 0.010)


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
