"""trainwise.common.noise: when a timing is disturbed, how much repeats spread, and when a
ratio of two timings may be shown."""

import sys
import types

import pytest

from trainwise.common import noise
from trainwise.common.noise import Spread, busy_machine, confident_ratio


@pytest.fixture
def two_cpus(monkeypatch):
    """A 2-CPU machine where this process tree has used no CPU lately; set the load with
    the returned function."""
    monkeypatch.setattr(noise.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(noise._OWN_LOAD, "now", lambda: 0.0)
    monkeypatch.setattr(noise, "_others_now", lambda window_s: None)  # no /proc/stat: the load average decides

    def load(value):
        monkeypatch.setattr(noise.os, "getloadavg", lambda: (value, value, value))

    return load


def test_a_quiet_machine_is_not_busy(two_cpus):
    two_cpus(0.3)
    assert busy_machine() is None


def test_other_processes_loading_the_cpus_make_the_machine_busy_and_say_how_much(two_cpus):
    two_cpus(5.2)
    assert busy_machine() == "machine busy: load 5.2 on 2 CPUs, about 5.2 of it from other processes"


def test_this_process_trees_own_load_is_not_counted_as_busy(two_cpus, monkeypatch):
    two_cpus(2.3)
    monkeypatch.setattr(noise._OWN_LOAD, "now", lambda: 2.0)  # our previous run kept both CPUs busy
    assert busy_machine() is None
    monkeypatch.setattr(noise._OWN_LOAD, "now", lambda: 1.0)
    assert "about 1.3 of it from other processes" in busy_machine()


def test_work_that_needs_one_cpu_tolerates_load_on_the_others(two_cpus):
    two_cpus(1.2)
    assert busy_machine() is not None  # a CPU timing wants both CPUs
    assert busy_machine(needs_cpus=1) is None  # a GPU timing drives the GPU from one


def test_own_load_follows_this_process_cpu_use(monkeypatch):
    """Two CPU-seconds per wall second for the last minute counts as a load of about 2 x (1 - 1/e)."""
    clock = iter([0.0, 60.0])
    monkeypatch.setattr(noise.time, "monotonic", lambda: next(clock, 60.0))
    cpu = iter([10.0, 130.0])
    monkeypatch.setattr(noise.os, "times", lambda: types.SimpleNamespace(
        user=next(cpu), system=0.0, children_user=0.0, children_system=0.0))
    own = noise._OwnLoad()
    assert own.now() == pytest.approx(2.0 * (1 - 1 / 2.718281828), rel=1e-3)


def test_a_finished_run_still_in_the_load_average_does_not_make_a_quiet_machine_busy(two_cpus, monkeypatch):
    """The 1-minute load average counts, for a minute after, a run that has ended (a
    benchmark's previous run, a calibration just before); what other processes do in the
    second before the timing decides."""
    two_cpus(2.4)
    monkeypatch.setattr(noise, "_others_now", lambda window_s: 0.1)
    assert busy_machine() is None
    monkeypatch.setattr(noise, "_others_now", lambda window_s: 1.6)
    assert busy_machine() == "machine busy: other processes used 1.6 of 2 CPUs in the 1 s before the run"


def test_others_cpu_use_is_the_machines_busy_time_less_this_process_trees_own(monkeypatch):
    """3 CPU-seconds busy in a 1.5 s window, 0.6 of them ours (our own or a finished child's):
    other processes used 1.6 CPUs."""
    machine, own, clock = iter([100.0, 103.0]), iter([5.0, 5.6]), iter([10.0, 11.5])
    monkeypatch.setattr(noise, "machine_busy_s", lambda: next(machine))
    monkeypatch.setattr(noise, "own_cpu_s", lambda: next(own))
    monkeypatch.setattr(noise.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(noise.time, "sleep", lambda seconds: None)
    assert noise._others_now(1.5) == pytest.approx(1.6)


def test_the_machines_busy_time_is_read_from_proc_stat_where_there_is_one():
    busy = noise.machine_busy_s()
    if busy is None:
        pytest.skip("no /proc/stat on this system")
    assert 0 < busy <= noise.machine_busy_s()


def _fake_nvml(monkeypatch, pids, utilisation):
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: "gpu0", nvmlDeviceGetUUID=lambda handle: "GPU-abc",
        nvmlDeviceGetComputeRunningProcesses=lambda handle: [types.SimpleNamespace(pid=p) for p in pids],
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=utilisation))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_another_process_on_the_gpu_makes_it_busy_but_ours_do_not(two_cpus, monkeypatch):
    two_cpus(0.0)
    _fake_nvml(monkeypatch, [noise.os.getpid(), 999_999_999], 0)
    assert busy_machine("cuda") == "GPU busy: GPU 0 is used by other processes (pid 999999999)"
    _fake_nvml(monkeypatch, [noise.os.getpid()], 0)
    assert busy_machine("cuda") is None
    assert busy_machine("cpu") is None  # a CPU timing does not ask the GPU


def test_a_gpu_already_working_before_the_run_is_busy(two_cpus, monkeypatch):
    two_cpus(0.0)
    _fake_nvml(monkeypatch, [], 85)
    assert busy_machine("cuda:0") == "GPU busy: GPU 0 was 85 % utilised before the run"


def test_a_busy_gpu_this_process_cannot_see_does_not_count(two_cpus, monkeypatch):
    two_cpus(0.0)
    _fake_nvml(monkeypatch, [999_999_999], 85)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert busy_machine("cuda") is None


def test_spread_is_max_minus_min_over_the_median():
    spread = Spread.of([10.0, 11.0, 12.0])
    assert spread.median == 11.0 and spread.low == 10.0 and spread.high == 12.0
    assert spread.spread == pytest.approx(2 / 11)
    assert spread.to_json() == {"n": 3, "median": 11.0, "min": 10.0, "max": 12.0, "spread_pct": 18.2,
                                "samples": [10.0, 11.0, 12.0]}


def test_from_five_samples_one_stray_sample_does_not_decide_the_spread():
    assert Spread.of([10.0, 10.1, 10.2, 10.3, 30.0]).spread == pytest.approx(0.2 / 10.2)
    assert Spread.of([8.0, 10.0, 10.1, 12.0, 30.0]).spread == pytest.approx(2.0 / 10.1)


def test_missing_and_non_positive_samples_are_left_out():
    spread = Spread.of([None, 0.0, float("nan"), 4.0])
    assert spread.samples == (4.0,) and spread.spread is None


def test_steady_timings_on_a_quiet_machine_give_the_ratio_of_medians():
    ratio = confident_ratio(Spread.of([12.0, 12.5, 12.2]), Spread.of([10.0, 10.4, 10.1]))
    assert ratio.value == pytest.approx(12.2 / 10.1) and ratio.withheld is None and ratio.text() == "1.21x"


def test_a_spread_over_the_threshold_withholds_the_ratio_and_says_which():
    ratio = confident_ratio(Spread.of([12.0, 12.5, 12.2]), Spread.of([8.0, 10.0, 10.1]))
    assert ratio.value is None and ratio.withheld == "spread 21 % > 10 %"
    assert confident_ratio(Spread.of([12.0, 12.5]), Spread.of([8.0, 10.0]), threshold=0.25).value is not None


def test_a_busy_machine_withholds_the_ratio_whatever_the_spread():
    ratio = confident_ratio(Spread.of([12.0, 12.0]), Spread.of([10.0, 10.0]), busy="machine busy: load 5.2 on 2 CPUs")
    assert ratio.value is None and ratio.text() == "not shown: machine busy: load 5.2 on 2 CPUs"


def test_one_sample_has_no_spread_to_trust():
    ratio = confident_ratio(Spread.of([12.0]), Spread.of([10.0, 10.0]))
    assert ratio.withheld == "one sample: no spread to judge it by"


def test_a_spread_just_over_the_threshold_never_reads_as_equal_to_it():
    from trainwise.common.noise import _beside

    assert _beside(0.104, 0.10) == "10.4 %" and _beside(0.23, 0.10) == "23 %"
