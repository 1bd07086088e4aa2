"""A CPU profile predicts the step at the settings it was measured under: the thread count,
the clock, the CPU. Under others, estimate, plan and train --plan auto refuse it (exit 2,
one line naming the setting and how to calibrate again)."""

from __future__ import annotations

import time

import pytest
import torch

from trainwise.cli.main import main
from trainwise.common.errors import InputError
from trainwise.hardware import resolve_device
from trainwise.hardware.host import cpu_model
from trainwise.hardware.profile import DeviceProfile, Rate, default_profile_path, profile_for, write_profile
from trainwise.hardware.profile_settings import present_settings
from trainwise.plan.plan import Plan

CPU_PLAN = Plan(device="cpu", seq_len=32)


def _cpu_profile(**measured) -> DeviceProfile:
    return DeviceProfile("cpu", "cpu", "x", {"fp32": Rate(1e10, 2e-6)}, {"fp32": Rate(1e10, 2e-6)},
                         Rate(1e9, 1e-6), 5e-6, measured=measured)


def _other_threads() -> int:
    return 1 if torch.get_num_threads() != 1 else 2


def test_a_profile_calibrated_at_another_thread_count_is_refused_naming_threads_and_calibrate(tmp_path):
    path = write_profile(_cpu_profile(torch_threads=_other_threads(), clock="wall", cpu_model=cpu_model()),
                         tmp_path / "cpu.json")
    with pytest.raises(InputError) as err:
        profile_for(resolve_device("cpu"), path)
    message = str(err.value)
    assert message.startswith("--profile:") and "CPU threads" in message and "\n" not in message
    assert f"trainwise calibrate --device cpu --out {path}" in message
    assert f"OMP_NUM_THREADS={_other_threads()}" in message


def test_a_profile_of_these_settings_is_used():
    here = present_settings()
    profile = _cpu_profile(torch_threads=here["torch_threads"], clock="wall", cpu_model=here["cpu_model"],
                           allocator=here["allocator"])
    from trainwise.api import estimate

    assert estimate("tiny-llama", CPU_PLAN, profile=profile).time.step_s > 0


@pytest.mark.parametrize("setting", ["clock", "cpu_model"])
def test_a_profile_timed_by_another_clock_or_on_another_cpu_is_refused(setting):
    here = {**present_settings(), "clock": "cpu" if setting == "clock" else "wall",
            "cpu_model": "Some Other CPU 9000" if setting == "cpu_model" else cpu_model()}
    from trainwise.api import estimate

    with pytest.raises(InputError, match="cpu seconds" if setting == "clock" else "Some Other CPU 9000"):
        estimate("tiny-llama", CPU_PLAN, profile=_cpu_profile(**here))


@pytest.mark.parametrize("command", [["estimate", "tiny-llama", "--device", "cpu"],
                                     ["plan", "tiny-llama", "--device", "cpu", "--seq-len", "32"]])
def test_estimate_and_plan_exit_2_on_the_cached_profile_of_another_thread_count(command, tmp_path, monkeypatch,
                                                                                capsys):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    write_profile(_cpu_profile(torch_threads=_other_threads(), clock="wall", cpu_model=cpu_model()),
                  default_profile_path(resolve_device("cpu")))
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CPU threads" in err and "trainwise calibrate --device cpu" in err
    assert "Traceback" not in err


def test_calibrate_times_wall_seconds_at_one_thread_too_as_train_does():
    """A step a user times is wall time; a profile timed in this process's CPU seconds at one
    thread predicted a step with a core to itself."""
    from trainwise.calibration.timing import synchronizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clock = synchronizer(torch.device("cpu")).clock
    finally:
        torch.set_num_threads(threads)
    started = clock()
    time.sleep(0.05)  # waiting for a core, as on a busy machine, is in the step's wall time
    assert clock() - started >= 0.05


def test_the_cpu_is_named_with_its_family_and_model_so_two_generations_behind_one_generic_name_differ(
        tmp_path, monkeypatch):
    """A virtual machine may show only "AMD EPYC": two sessions' CPUs of that name ran the
    same search at half and twice the speed, and a profile measured on one would have been
    accepted on the other."""
    from trainwise.hardware import host

    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\n"
    names = []
    for family, model in ((25, 1), (26, 2)):
        cpuinfo = tmp_path / f"cpuinfo-{family}"
        cpuinfo.write_text("\n".join(block.format(n=n, family=family, model=model) for n in range(2)))
        real_path = host.Path
        monkeypatch.setattr(host, "Path", lambda _path, _file=cpuinfo: real_path(_file))
        names.append(host.cpu_model())
        monkeypatch.setattr(host, "Path", real_path)
    assert names == ["AMD EPYC (family 25, model 1)", "AMD EPYC (family 26, model 2)"]
    profile = _cpu_profile(torch_threads=torch.get_num_threads(), clock="wall", cpu_model=names[0])
    monkeypatch.setattr("trainwise.hardware.profile_settings.cpu_model", lambda: names[1])
    from trainwise.api import estimate

    with pytest.raises(InputError, match="family 25, model 1"):
        estimate("tiny-llama", CPU_PLAN, profile=profile)


@pytest.mark.parametrize("recorded", [None, "glibc default"])
def test_a_profile_measured_while_glibc_faulted_freed_memory_in_afresh_is_refused(recorded):
    """A step under glibc's default allocator faults its freed memory in again every step
    (a tenth of the step or more on this project's CPU): a profile measured so, or before
    the allocator was recorded, does not price the step `train` runs now."""
    here = present_settings()
    if here["allocator"] == "glibc default":
        pytest.skip("glibc refused to keep freed memory here: the profiles would match")
    settings = {"torch_threads": here["torch_threads"], "clock": "wall", "cpu_model": here["cpu_model"]}
    if recorded:
        settings["allocator"] = recorded
    from trainwise.api import estimate

    with pytest.raises(InputError, match="allocator") as err:
        estimate("tiny-llama", CPU_PLAN, profile=_cpu_profile(**settings))
    assert "trainwise calibrate --device cpu" in str(err.value) and "\n" not in str(err.value)
