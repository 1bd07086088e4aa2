"""A GPU's complete profile: calibrate measures the fp8 matmul rate, host-device copies
both ways, the CUDA context's memory and the host time under torch.compile, and the
estimate uses each where the profile has it, saying "catalog", "assumed" or "measured".

This machine has no GPU: the measurements' arithmetic is checked with controlled clocks
and faked device queries, the GPU-only branches skip without CUDA, and the one test that
measures a real GPU is marked `gpu`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainwise.calibration import compiled_host, compute, context, memory
from trainwise.calibration.timing import QUICK, Synchronizer
from trainwise.estimator.activation_offload_time import OffloadTraffic, activation_offload_seconds, copy_rates_text
from trainwise.estimator.step_time import matmul_rate_notes, step_breakdown
from trainwise.hardware.device import cpu_device
from trainwise.hardware.gpu import FLOAT8_CAPABILITY
from trainwise.hardware.catalog_profile import catalog_profile
from trainwise.hardware.profile import CORRECTIONS_OVER_CATALOG, DeviceProfile, Rate, read_profile, write_profile
from trainwise.hardware.resolve import resolve_device
from trainwise.plan.plan import Plan
from trainwise.trace.op_table import OpCosts

MiB = 2**20


def _gpu_profile(**fields) -> DeviceProfile:
    """A calibrated profile of a GPU (the catalog H100's name) without the new fields."""
    base = DeviceProfile("H100-80GB", "cuda", "/profiles/h100.json", {"fp32": Rate(50e12), "bf16": Rate(600e12)},
                         {}, Rate(2e12), 10e-6, host_to_device=Rate(50e9))
    return dataclasses.replace(base, **fields)


# --- the profile's new fields ---------------------------------------------------------

def test_the_new_fields_are_written_and_read_back(tmp_path):
    profile = _gpu_profile(device_to_host=Rate(40e9, 8e-6), context_bytes=517 * MiB,
                           matmul={"fp32": Rate(50e12), "fp8": Rate(1.2e15, 5e-6)})
    back = read_profile(write_profile(profile, tmp_path / "h100.json"))
    assert back.device_to_host == Rate(40e9, 8e-6) and back.context_bytes == 517 * MiB
    assert back.matmul["fp8"] == Rate(1.2e15, 5e-6)


def test_a_profile_written_before_them_still_reads_and_falls_back(tmp_path):
    old = _gpu_profile().to_json()
    for key in ("device_to_host", "context_bytes"):
        del old[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    profile = read_profile(path)
    assert profile.device_to_host is None and profile.context_bytes is None
    assert profile.device_to_host_rate == profile.host_to_device == Rate(50e9)


# --- (a) fp8 matmuls ------------------------------------------------------------------

@pytest.mark.parametrize("capability, has_fp8", [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)])
def test_fp8_is_measured_only_where_the_gpu_has_fp8_tensor_cores(monkeypatch, capability, has_fp8):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert ("fp8" in compute.dtypes_to_measure(torch.device("cuda:0"))) is has_fp8
    assert "fp8" not in compute.dtypes_to_measure(torch.device("cpu"))


def test_the_fp8_matmul_is_torchs_scaled_mm_on_shapes_aligned_to_16():
    """torch 2.13 runs _scaled_mm on the CPU too, so the measuring code itself runs here
    (calibrate asks for fp8 only on a GPU of capability 8.9+)."""
    a = torch.randn(32, 48).to(torch.float8_e4m3fn)
    b_rows = torch.randn(16, 48).to(torch.float8_e4m3fn)
    out = compute.fp8_matmul(a, b_rows)()
    assert out.shape == (32, 16) and out.dtype == torch.bfloat16
    expected = a.float() @ b_rows.float().t()
    assert torch.allclose(out.float(), expected, rtol=0.02, atol=0.05)
    found = compute.measure_matmul(torch.device("cpu"), "fp8", dataclasses.replace(QUICK, max_call_s=0.0))
    assert found.rate.per_s > 0 and len(found.points) == 2  # stopped after two sizes (max_call_s 0)
    assert all(flops % (2 * 16**3) == 0 for flops, _ in found.points)


def _matmul_costs(dtype: str, flops: int) -> OpCosts:
    return OpCosts({("forward", 0, "matmul", dtype, False, 0): [1, flops, 0, 0]})


def test_a_measured_fp8_rate_prices_fp8_matmuls_and_the_note_says_measured():
    profile = _gpu_profile(matmul={"fp32": Rate(50e12), "fp8": Rate(1e15)})
    costs = _matmul_costs("fp8", 10**15)
    assert step_breakdown(costs, {0: 1, 1: 0}, Plan(), profile)["matmul"] == pytest.approx(1.0)
    (note,) = matmul_rate_notes(costs, Plan(), profile)
    assert note.startswith("fp8 matmuls at 1e+03 TFLOP/s, measured (the profile /profiles/h100.json)")


def test_without_a_measured_fp8_rate_the_bf16_rate_stands_in_and_the_note_says_assumed():
    # float8 replaces bf16 matmuls: without an fp8 rate they are priced as the bf16 they
    # replace (the fp32 rate priced a float8 plan 12x slower than its bf16 one here).
    profile = _gpu_profile()
    costs = _matmul_costs("fp8", 6 * 10**14)
    assert step_breakdown(costs, {0: 1, 1: 0}, Plan(), profile)["matmul"] == pytest.approx(1.0)
    (note,) = matmul_rate_notes(costs, Plan(), profile)
    assert "priced at the bf16 matmul rate" in note and "assumed" in note and "8.9" in note
    fp32_only = _gpu_profile(matmul={"fp32": Rate(50e12)})
    assert step_breakdown(costs, {0: 1, 1: 0}, Plan(), fp32_only)["matmul"] == pytest.approx(12.0)
    assert "priced at the fp32 matmul rate" in matmul_rate_notes(costs, Plan(), fp32_only)[0]
    catalog = catalog_profile(resolve_device("H100-SXM"))
    (note,) = matmul_rate_notes(costs, Plan(), catalog)
    assert note.startswith("fp8 matmuls at") and "catalog figures x assumed efficiencies" in note


def test_rates_the_profile_has_for_other_dtypes_add_no_note():
    assert matmul_rate_notes(_matmul_costs("bf16", 10**12), Plan(precision="bf16"), _gpu_profile()) == []


# --- (b) host-device copies -----------------------------------------------------------

@pytest.fixture
def timed_copies(monkeypatch):
    """A clock that each copy_ advances by 20 us + bytes / 25 GB/s, and the bytes' direction."""
    now, seen = [0.0], []
    original = torch.Tensor.copy_

    def copy_(self, source, non_blocking=False):
        now[0] += 20e-6 + source.nbytes / 25e9
        seen.append(source.nbytes)
        return original(self, source, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(memory, "synchronizer", lambda device: Synchronizer(lambda: None, lambda: now[0]))
    return seen


@pytest.mark.parametrize("direction", ["host_to_device", "device_to_host"])
def test_a_copy_rate_is_the_large_copies_rate_and_the_small_ones_fixed_cost(timed_copies, direction):
    found = memory.measure_copy(torch.device("cpu"), direction, QUICK, pinned=False)
    assert found.rate.per_s == pytest.approx(25e9, rel=1e-6) and found.rate.fixed_s == pytest.approx(20e-6, rel=1e-6)
    assert [size for size, _ in found.points] == memory.copy_sizes(QUICK)
    assert max(timed_copies) == 2**24  # the 16 MiB copies were made


def test_a_copy_moves_the_bytes_the_way_it_is_named(monkeypatch):
    """On a GPU the host end is pinned; the device end is faked by a second CPU tensor,
    told apart by being made second."""
    made = []
    randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **k: made.append(randint(*a, **k)) or made[-1])
    for direction in memory.COPY_DIRECTIONS:
        made.clear()
        source, destination = memory.copy_ends(64, torch.device("cpu"), direction, pinned=False)
        host, device = made
        assert (source, destination) == ((host, device) if direction == "host_to_device" else (device, host))
    with pytest.raises(ValueError, match="direction 'sideways'"):
        memory.measure_copy(torch.device("cpu"), "sideways", QUICK, pinned=False)


def test_activation_offload_copies_out_at_the_device_to_host_rate_and_back_at_the_other():
    """1 GB each way, nothing to hide behind: out at 0.5 GB/s (2 s), the first block back
    (0.25 GB) at 1 GB/s (0.25 s), the rest (0.75 s) exposed too."""
    profile = dataclasses.replace(_gpu_profile(), host_to_device=Rate(1e9), device_to_host=Rate(0.5e9))
    traffic = OffloadTraffic(per_micro_batch=10**9, last_block=250_000_000)
    exposed, note = activation_offload_seconds(traffic, {}, 1, profile)
    assert exposed == pytest.approx(2.0 + 0.25 + 0.75)
    assert "host to device 1 GB/s (measured), device to host 0.5 GB/s (measured)" in note
    same, note = activation_offload_seconds(traffic, {}, 1, dataclasses.replace(profile, device_to_host=None))
    assert same == pytest.approx(1.0 + 0.25 + 0.75) and "device to host assumed the same (not measured)" in note
    catalog = catalog_profile(resolve_device("H100-SXM"))
    assert "(catalog PCIe figure x assumed efficiency)" in activation_offload_seconds(traffic, {}, 1, catalog)[1]


def test_a_cache_file_of_catalog_figures_plus_corrections_is_not_called_measured():
    """plan --verify writes the catalog's figures into a file with its corrections: a file,
    but its rates are the catalog's."""
    catalog = catalog_profile(resolve_device("H100-SXM"))
    cached = dataclasses.replace(catalog, source="/cache/H100-80GB.json", measured={"kind": CORRECTIONS_OVER_CATALOG})
    assert not cached.rates_measured and "catalog PCIe figure" in copy_rates_text(cached)
    (note,) = matmul_rate_notes(_matmul_costs("fp8", 10**15), Plan(), cached)
    assert "catalog figures x assumed efficiencies" in note and "measured" not in note


# --- (c) the CUDA context -------------------------------------------------------------

def test_the_cpu_has_no_context_to_measure():
    assert context.measure_context(torch.device("cpu")) is None


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's queries answered without a GPU: 600 MiB held by the process (NVML),
    80 MiB of it reserved by the caching allocator."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 80 * MiB)
    _nvml_reads(monkeypatch, 600 * MiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70_000 * MiB, 81_000 * MiB))


def _nvml_reads(monkeypatch, held):
    """NVML's figure for this process: `held` bytes, or None (not listed)."""
    class Reader:
        def __init__(self, device):
            pass

        def used_bytes(self):
            return held
    monkeypatch.setattr(context, "ProcessGpuMemory", Reader)


def test_the_context_is_what_the_process_holds_beyond_the_allocators_reserve(fake_cuda):
    found = context.measure_context(torch.device("cuda:0"))
    assert found == {"bytes": 520 * MiB, "method": context.PER_PROCESS, "held": 600 * MiB, "reserved": 80 * MiB}


def test_without_nvml_the_devices_used_memory_is_read_and_the_profile_says_so(fake_cuda, monkeypatch):
    _nvml_reads(monkeypatch, None)
    found = context.measure_context(torch.device("cuda:0"))
    assert found["bytes"] == 11_000 * MiB - 80 * MiB and found["method"] == context.WHOLE_DEVICE
    assert "every process" in found["method"]


def test_a_reading_below_the_allocators_reserve_is_refused(fake_cuda, monkeypatch):
    _nvml_reads(monkeypatch, 10 * MiB)
    with pytest.raises(RuntimeError, match="below what the caching allocator reserved"):
        context.measure_context(torch.device("cuda:0"))


def _h100_estimate(profile):
    from trainwise.api.estimate import estimate

    return estimate("tiny-llama", Plan.from_dict({"batch_size": 2, "seq_len": 64, "device": "H100-SXM",
                                                  "precision": "bf16"}), profile=profile)


def test_the_memory_estimate_uses_a_measured_context_and_says_so():
    estimated = _h100_estimate(_gpu_profile())
    measured = _h100_estimate(_gpu_profile(context_bytes=517 * MiB))
    assert measured.memory.context == 517 * MiB != estimated.memory.context
    assert measured.memory.device_total == measured.memory.peak_reserved + 517 * MiB
    assert measured.memory.peak_reserved == estimated.memory.peak_reserved
    assert measured.to_json()["memory"]["context_source"] == "measured by trainwise calibrate"
    assert estimated.to_json()["memory"]["context_source"].startswith("estimated")


def test_a_context_measured_on_another_gpu_is_not_applied():
    other = _gpu_profile(context_bytes=517 * MiB, device_name="A100-80GB")
    from trainwise.hardware.profile import with_measured_context

    device = resolve_device("H100-SXM")
    assert with_measured_context(device, other) is device
    assert with_measured_context(cpu_device(), other).context_bytes == 0


# --- (d) host time under torch.compile ------------------------------------------------

def test_kernel_and_region_host_times_come_from_the_line_through_the_chains():
    """seconds(B) = 2 x 40 us + B x (5 x 6 us + 10 us of priced device work)."""
    points = [(blocks, 80e-6 + blocks * (5 * 6e-6 + 10e-6)) for blocks in (1, 8, 16)]
    found = compiled_host.compiled_host_costs(points, 10e-6)
    assert found["kernel_s"] == pytest.approx(6e-6) and found["region_s"] == pytest.approx(40e-6)
    assert "why" not in found
    on_a_gpu = compiled_host.compiled_host_costs(points, 0.0)  # nothing taken out: the host queues ahead
    assert on_a_gpu["kernel_s"] == pytest.approx(8e-6)


@pytest.mark.parametrize("points, device_s, missing", [
    ([(1, 300e-6), (8, 200e-6)], 0.0, ("kernel_s", "region_s")),  # no growth: a busy machine
    ([(1, 100e-6), (8, 240e-6)], 30e-6, ("kernel_s",)),  # 20 us a block, priced at 30 us of device work
    ([(1, 20e-6), (8, 160e-6)], 0.0, ("region_s",)),  # the line passes through zero
])
def test_what_the_points_cannot_give_is_none_with_why(points, device_s, missing):
    found = compiled_host.compiled_host_costs(points, device_s)
    assert all(found[key] is None for key in missing) and found["why"]
    assert all(found[key] is not None for key in ("kernel_s", "region_s") if key not in missing)


def test_the_block_device_work_is_priced_at_the_profiles_rates():
    profile = dataclasses.replace(_gpu_profile(), matmul={"fp32": Rate(2 * 16**3 / 1e-6, 3e-6)},
                                  memory=Rate(4 * 16 * 16 * 4 / 1e-6, 2e-6))
    assert compiled_host.block_device_seconds(profile) == pytest.approx(3 * (3e-6 + 1e-6) + 2 * 2e-6 + 1e-6)


def test_calibrate_sets_the_compiled_host_times_it_measured_and_leaves_quick_to_the_built_in(monkeypatch):
    from trainwise.api import calibrate
    from trainwise.calibration.timing import FULL

    found = {"kernel_s": 7e-6, "region_s": None, "why": "the line passes through zero"}
    monkeypatch.setattr(compiled_host, "measure_compiled_host", lambda device, profile, settings: found)
    profile = dataclasses.replace(_gpu_profile(), measured={})
    full = calibrate._with_compiled_host(profile, torch.device("cuda"), FULL)  # a GPU: the chain alone
    assert full.host_s_per_compiled_kernel == 7e-6 and full.host_s_per_compiled_region is None
    assert full.compiled_kernel_host_s == 7e-6 and full.compiled_region_host_s == 40e-6  # the built-in CUDA figure
    assert full.measured["compiled_host"] is found
    quick = calibrate._with_compiled_host(dataclasses.replace(_gpu_profile(), measured={}), torch.device("cuda"), QUICK)
    assert quick.host_s_per_compiled_kernel is None and "--quick" in quick.measured["compiled_host"]["why"]


def test_a_machine_where_torch_compile_fails_keeps_the_built_in_figures(monkeypatch):
    def no_compiler(module):
        raise RuntimeError("InductorError: CppCompileError: no C++ compiler found\nmore")
    monkeypatch.setattr(torch, "compile", no_compiler)
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e10), 5e-6)
    found = compiled_host.measure_compiled_host(torch.device("cpu"), profile, QUICK)
    assert found["kernel_s"] is None and found["region_s"] is None and found["points"] == []
    assert found["why"] == ("torch.compile failed on this machine (RuntimeError: InductorError: CppCompileError: "
                            "no C++ compiler found): nothing measured")


def test_the_compiled_note_says_which_host_times_were_measured():
    from trainwise.estimator.step_time import compiled_host_text

    assert compiled_host_text(_gpu_profile()) == ("5 us built in, not measured per kernel, "
                                                  "40 us built in, not measured per region call")
    measured = _gpu_profile(host_s_per_compiled_kernel=7e-6)
    assert compiled_host_text(measured) == "7 us measured per kernel, 40 us built in, not measured per region call"


@pytest.mark.slow
def test_a_compiled_chain_is_timed_on_the_cpu():
    """Compiles two chains (seconds each): the measurement runs end to end; its figures on a
    shared machine are whatever it was, or None with why."""
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e10, 1e-6), 5e-6)
    found = compiled_host.measure_compiled_host(torch.device("cpu"), profile, QUICK)
    assert [blocks for blocks, _ in found["points"]] == list(compiled_host.block_counts(QUICK))
    assert all(seconds > 0 for _, seconds in found["points"])
    assert (found["kernel_s"] is not None and found["kernel_s"] > 0) or found["why"]


# --- what calibrate shows and does where there is no GPU -------------------------------

def test_the_calibrate_table_shows_each_new_measurement():
    from trainwise.cli.render_calibrate import rate_rows

    profile = _gpu_profile(device_to_host=Rate(40e9, 8e-6), context_bytes=517 * MiB,
                           matmul={"fp32": Rate(50e12), "fp8": Rate(1.2e15)},
                           host_s_per_compiled_kernel=6e-6, host_s_per_compiled_region=45e-6)
    rows = {what: (throughput, fixed) for what, throughput, fixed in rate_rows(profile)}
    assert rows["matmul fp8"][0] == "1.2e+03 TFLOP/s"
    assert rows["device to host (pinned)"] == ("40 GB/s", "8 µs")
    assert rows["host per kernel a compiled region launches"][1] == "6 µs"
    assert rows["host per call into a compiled region"][1] == "45 µs"
    assert rows["CUDA context and loaded kernels (device memory outside the allocator)"][0] == "517 MiB"


def test_on_the_cpu_the_gpu_measurements_are_not_made(monkeypatch):
    from trainwise.api import calibrate

    asked = []
    for name in ("measure_copy",):
        monkeypatch.setattr(memory, name, lambda *a, **k: asked.append(a))
    monkeypatch.setattr(compute, "measure_matmul", lambda device, dtype, settings: asked.append(dtype) or _fit())
    monkeypatch.setattr(compute, "measure_attention", lambda *a, **k: dict.fromkeys(compute.HEAD_DIMS, _fit()))
    for name in ("measure_bytes", "measure_optimizer"):
        monkeypatch.setattr(memory, name, lambda *a, **k: _fit())
    monkeypatch.setattr(memory, "measure_bytes_relative", lambda *a, **k: (2.0, {"ratio": 2.0, "spread": 0.0}))
    monkeypatch.setattr(memory, "measure_host_overhead", lambda *a, **k: (5e-6, 0.0))
    rates, _, _ = calibrate._measure_one_device(torch.device("cpu"), QUICK)
    assert "fp8" not in asked and not any(isinstance(a, tuple) for a in asked)
    assert "device_to_host" not in rates and "host_to_device" not in rates


def _fit():
    from trainwise.calibration.timing import Fit

    return Fit(Rate(1e9, 1e-6), [(1.0, 1e-6)], 0.0)


@pytest.mark.gpu
def test_calibrate_on_a_gpu_measures_the_complete_profile(tmp_path):
    from trainwise.api.calibrate import calibrate

    profile = calibrate("cuda", out=tmp_path / "gpu.json", quick=True).profile
    has_fp8 = torch.cuda.get_device_capability() >= FLOAT8_CAPABILITY
    assert ("fp8" in profile.matmul) is has_fp8
    assert profile.host_to_device.per_s > 1e9 and profile.device_to_host.per_s > 1e9
    assert 100 * MiB < profile.context_bytes < 4096 * MiB
    assert profile.measured["context"]["method"] in (context.PER_PROCESS, context.WHOLE_DEVICE)
