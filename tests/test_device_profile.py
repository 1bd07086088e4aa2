"""Device profiles: catalog figures, the JSON round trip, the per-user cache and bad files."""

from __future__ import annotations

import json
import math

import pytest

from trainwise.common.errors import InputError
from trainwise.hardware import resolve_device
from trainwise.hardware.catalog import catalog
from trainwise.hardware.catalog_profile import MATMUL_EFFICIENCY, PCIE_EFFICIENCY, catalog_profile
from trainwise.hardware.profile import (
    DeviceProfile,
    Rate,
    default_profile_path,
    profile_for,
    read_profile,
    write_profile,
)


def test_rate_is_latency_plus_size_over_bandwidth():
    rate = Rate(per_s=1e9, fixed_s=1e-6)
    assert rate.seconds(1e9) == pytest.approx(1.0 + 1e-6)
    assert rate.seconds(0) == 0.0


def test_catalog_profile_scales_vendor_peaks():
    h100 = resolve_device("H100")
    profile = catalog_profile(h100)
    assert profile.source == "catalog" and profile.kind == "cuda"
    assert profile.matmul["bf16"].per_s == pytest.approx(989.4e12 * MATMUL_EFFICIENCY)
    assert profile.collectives["all_reduce"].per_s == pytest.approx(900e9 / 2 * 0.75)
    assert profile.host_to_device.per_s == pytest.approx(64e9 * 0.8)
    assert catalog_profile(resolve_device("cpu")) is None


@pytest.mark.parametrize("gpu", catalog(), ids=lambda gpu: gpu.name)
def test_every_catalog_gpu_has_a_host_device_copy_rate_from_its_pcie_generation(gpu):
    # Without one, activation and CPU offload cost nothing in the search's eyes on that GPU.
    profile = catalog_profile(resolve_device(gpu.name))
    per_direction = {3: 16e9, 4: 32e9, 5: 64e9}[gpu.pcie_gen]
    assert profile.host_to_device.per_s == pytest.approx(per_direction * PCIE_EFFICIENCY)


def test_v100_and_t4_copy_over_pcie_gen3_at_half_a100s_rate():
    rates = {name: catalog_profile(resolve_device(name)).host_to_device.per_s for name in ("V100", "T4", "A100")}
    assert rates["V100"] == rates["T4"] == pytest.approx(rates["A100"] / 2)
    # 1 GB each way of offloaded activations is most of a tenth of a second, not free.
    assert catalog_profile(resolve_device("T4")).host_to_device.seconds(1e9) > 0.07


def test_profile_round_trips_through_a_file(tmp_path):
    profile = catalog_profile(resolve_device("A100-80GB"))
    path = write_profile(profile, tmp_path / "a100.json")
    back = read_profile(path)
    assert back.to_json() == profile.to_json()
    assert back.source == str(path)


def test_cached_profile_is_used_for_its_device(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    cpu = resolve_device("cpu")
    assert profile_for(cpu) is None  # no catalog figures for a CPU
    measured = DeviceProfile("cpu", "cpu", "x", {"fp32": Rate(1e11, 2e-6)}, {}, Rate(1e10, 1e-6), 5e-6)
    write_profile(measured, default_profile_path(cpu))
    assert profile_for(cpu).matmul["fp32"].per_s == 1e11


@pytest.mark.parametrize("content", ["not json", json.dumps({"version": 99}), json.dumps({"version": 1})])
def test_a_bad_profile_file_names_the_flag(tmp_path, content):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(InputError) as err:
        profile_for(resolve_device("cpu"), path)
    assert "--profile" in str(err.value)


def test_a_profile_of_another_gpu_is_refused(tmp_path):
    path = write_profile(catalog_profile(resolve_device("A100-80GB")), tmp_path / "a100.json")
    with pytest.raises(InputError, match="measured on A100-80GB"):
        profile_for(resolve_device("H100"), path)


def test_the_step_compute_factor_round_trips_and_an_older_file_without_it_reads_as_one(tmp_path):
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e9), 1e-5, step_compute_factor=1.7)
    assert read_profile(write_profile(profile, tmp_path / "new.json")).step_compute_factor == 1.7
    older = profile.to_json()
    del older["step_compute_factor"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    assert read_profile(tmp_path / "old.json").step_compute_factor == 1.0


def test_the_transcendental_rate_and_non_matmul_factor_round_trip_and_older_files_read_without_them(tmp_path):
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e9), 1e-5,
                            transcendental=Rate(1e10, 2e-6), step_non_matmul_factor=2.2)
    again = read_profile(write_profile(profile, tmp_path / "new.json"))
    assert again.transcendental == Rate(1e10, 2e-6) and again.step_non_matmul_factor == 2.2
    older = profile.to_json()
    del older["transcendental"], older["step_non_matmul_factor"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_profile(tmp_path / "old.json")
    assert old.transcendental is None and old.step_non_matmul_factor == 1.0
    assert catalog_profile(resolve_device("H100")).transcendental is None  # a GPU's are memory-bound


def test_the_step_factors_optimizer_rate_and_recompute_host_round_trip_and_older_files_read_without_them(tmp_path):
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e9), 1e-5,
                            step_contraction_factor=1.3, optimizer=Rate(2e9, 3e-6), host_s_per_recomputed_op=3e-5,
                            host_s_per_selective_recomputed_op=7e-5)
    again = read_profile(write_profile(profile, tmp_path / "new.json"))
    assert (again.step_contraction_factor, again.optimizer, again.host_s_per_recomputed_op) == (1.3, Rate(2e9, 3e-6), 3e-5)
    assert again.host_s_per_selective_recomputed_op == 7e-5
    older = json.loads((tmp_path / "new.json").read_text())
    del older["step_contraction_factor"], older["optimizer"], older["host_s_per_recomputed_op"]
    del older["host_s_per_selective_recomputed_op"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_profile(tmp_path / "old.json")
    assert (old.step_contraction_factor, old.optimizer, old.host_s_per_recomputed_op) == (1.0, None, None)
    assert old.host_s_per_selective_recomputed_op is None


def test_attention_rates_by_head_dim_round_trip_and_an_older_file_without_them_prices_every_head_dim_at_one_rate(
        tmp_path):
    single = Rate(5e10, 1e-5)
    profile = DeviceProfile("cpu", "cpu", "test", {"bf16": Rate(1e11)}, {"bf16": single}, Rate(1e9), 1e-5,
                            attention_by_head_dim={"bf16": {16: Rate(2e10, 3e-5), 64: single}})
    again = read_profile(write_profile(profile, tmp_path / "new.json"))
    assert again.attention_by_head_dim == {"bf16": {16: Rate(2e10, 3e-5), 64: single}}
    assert again.attention_rate("bf16", 16) == Rate(2e10, 3e-5)
    older = json.loads((tmp_path / "new.json").read_text())
    del older["attention_by_head_dim"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_profile(tmp_path / "old.json")
    assert old.attention_by_head_dim == {}
    assert old.attention_rate("bf16", 16) == old.attention_rate("bf16", 128) == old.attention_rate("bf16") == single
    assert catalog_profile(resolve_device("H100")).attention_by_head_dim == {}  # catalog: one factor per dtype


def test_a_head_dim_between_measured_ones_is_read_in_log_head_dim_and_one_outside_takes_the_nearest():
    from trainwise.hardware.rate import rate_at_head_dim

    rates = {16: Rate(1e10, 4e-5), 64: Rate(3e10, 2e-5), 128: Rate(4e10, 1e-5)}
    assert rate_at_head_dim(rates, 32) == Rate(pytest.approx(2e10), pytest.approx(3e-5))  # halfway in log2
    assert rate_at_head_dim(rates, 96).per_s == pytest.approx(3e10 + 1e10 * math.log2(1.5))
    assert rate_at_head_dim(rates, 64) == rates[64]
    assert rate_at_head_dim(rates, 8) == rates[16] and rate_at_head_dim(rates, 256) == rates[128]
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e11)}, {"fp32": rates[64]}, Rate(1e9), 1e-5,
                            attention_by_head_dim={"fp32": rates})
    assert profile.attention_rate("fp32", 0) == rates[64]  # head dim unknown: the one rate
    assert profile.attention_rate("fp16", 16) == Rate(1e11)  # a dtype not measured: as before, the matmul rate


def test_element_wise_rates_by_dtype_round_trip_and_an_older_file_prices_every_dtype_at_the_fp32_rates(tmp_path):
    bf16 = {"memory": {"bf16": Rate(5e8, 2e-6)}, "transcendental": {"bf16": Rate(5e7)}, "random": {"bf16": Rate(5e6)}}
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e9), 1e-5,
                            transcendental=Rate(1e8), byte_rates_by_dtype=bf16)
    again = read_profile(write_profile(profile, tmp_path / "new.json"))
    assert again.byte_rates_by_dtype == bf16
    assert [again.byte_rate(kind, "bf16") for kind in ("memory", "transcendental", "random")] == [
        Rate(5e8, 2e-6), Rate(5e7), Rate(5e6)]
    assert again.byte_rate("memory", "fp32") == again.byte_rate("memory", "int64") == Rate(1e9)
    older = json.loads((tmp_path / "new.json").read_text())
    del older["byte_rates_by_dtype"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_profile(tmp_path / "old.json")
    assert old.byte_rates_by_dtype == {}
    assert old.byte_rate("memory", "bf16") == Rate(1e9) and old.byte_rate("transcendental", "bf16") == Rate(1e8)
    assert old.byte_rate("random", "bf16") == Rate(1e9)  # no random rate at all: the memory rate, as before
    with pytest.raises(ValueError, match="one of"):
        old.byte_rate("optimizer", "bf16")
    # A GPU's element-wise kernels move bytes at one DRAM bandwidth whatever the dtype.
    h100 = catalog_profile(resolve_device("H100"))
    assert h100.byte_rates_by_dtype == {} and h100.byte_rate("memory", "bf16") == h100.memory


def test_a_compiled_random_rate_round_trips_and_an_older_file_prices_compiled_dropout_at_the_eager_rate(tmp_path):
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e9), 1e-5, random=Rate(2e9),
                            byte_rates_by_dtype={"random": {"bf16": Rate(1e9)}}, compiled_random=Rate(1.5e9))
    again = read_profile(write_profile(profile, tmp_path / "new.json"))
    assert again.compiled_random == Rate(1.5e9)
    assert again.compiled_random_rate("fp32") == Rate(1.5e9)
    # bf16's per-byte slowdown of eager random numbers (half the bytes per element) carries over.
    assert again.compiled_random_rate("bf16") == Rate(0.75e9)
    older = json.loads((tmp_path / "new.json").read_text())
    del older["compiled_random"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_profile(tmp_path / "old.json")
    assert old.compiled_random is None
    assert old.compiled_random_rate("fp32") == Rate(2e9) and old.compiled_random_rate("bf16") == Rate(1e9)
