"""The GPU catalog, --device resolution and detection (no GPU needed: detection is faked)."""

import pytest

from trainwise.hardware import (
    GPU,
    Device,
    catalog,
    cublas_workspace_bytes,
    detect_gpus,
    find_gpu,
    match_catalog,
    resolve_device,
)
from trainwise.hardware import detect as detect_module
from trainwise.hardware.detect import DetectedGPU
from trainwise.common.errors import InputError

MiB = 1024**2

EXPECTED_NAMES = {"V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200",
                  "RTX-3090", "RTX-4090", "L4", "T4"}


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(detect_module, "read_cuda_devices", lambda: [])


@pytest.fixture
def one_gpu(monkeypatch):
    def fake(name, mib, capability, sms=108):
        found = [DetectedGPU(index=0, name=name, memory_bytes=mib * MiB,
                             compute_capability=capability, sm_count=sms, max_threads_per_sm=2048)]
        monkeypatch.setattr(detect_module, "read_cuda_devices", lambda: found)
    return fake


def test_catalog_has_the_promised_gpus():
    assert EXPECTED_NAMES <= {gpu.name for gpu in catalog()}


@pytest.mark.parametrize("gpu", catalog(), ids=lambda g: g.name)
def test_every_catalog_gpu_has_memory_overheads_and_rates(gpu: GPU):
    assert gpu.memory_bytes > 10 * 1024 * MiB
    assert 200 * MiB < gpu.context_bytes < 2048 * MiB
    assert gpu.cublas_workspace_bytes in (8_519_680, 32 * MiB)
    assert gpu.peak("fp32") and gpu.peak("fp16") and gpu.memory_bandwidth
    # Tensor-core paths the capability has, the table has, and the other way round.
    assert (gpu.peak("bf16") is not None) == gpu.supports_bf16
    assert (gpu.peak("tf32") is not None) == gpu.supports_tf32


def test_h100_memory_is_what_nvidia_smi_shows():
    assert find_gpu("H100-80GB").memory_bytes == 81559 * MiB


def test_bf16_and_flash_attention_are_unsupported_before_ampere():
    for name in ("V100-16GB", "V100-32GB", "T4"):
        gpu = find_gpu(name)
        assert not gpu.supports_bf16
        assert gpu.peak("bf16") is None
        assert not gpu.supports_flash_attention
    assert find_gpu("A100-80GB").supports_flash_attention
    assert find_gpu("RTX-4090").supports_bf16


def test_peak_accepts_dtype_spellings():
    a100 = find_gpu("A100-80GB")
    assert a100.peak("bf16") == a100.peak("bfloat16") == a100.peak("torch.bfloat16") == 312e12
    with pytest.raises(KeyError):
        a100.peak("complex64")


def test_hopper_gets_the_32_mib_cublas_workspace():
    assert find_gpu("H100-80GB").cublas_workspace_bytes == 32 * MiB
    assert find_gpu("H200").cublas_workspace_bytes == 32 * MiB
    assert find_gpu("A100-80GB").cublas_workspace_bytes == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert cublas_workspace_bytes((8, 9)) == 8_519_680


@pytest.mark.parametrize("spelling, name", [
    ("A100-80GB", "A100-80GB"),
    ("a100-80gb", "A100-80GB"),
    ("A100_80GB", "A100-80GB"),
    ("a100 80gb", "A100-80GB"),
    ("h100", "H100-80GB"),
    ("H100-SXM", "H100-80GB"),
    ("h100_pcie", "H100-PCIe"),
    ("rtx4090", "RTX-4090"),
    ("3090", "RTX-3090"),
    ("tesla-t4", "T4"),
    ("h200", "H200"),
])
def test_catalog_names_and_aliases_resolve(spelling, name):
    device = resolve_device(spelling)
    assert device.kind == "cuda"
    assert device.source == "catalog"
    assert device.gpu.name == name
    assert device.memory_bytes == device.gpu.memory_bytes


def test_unknown_name_lists_the_closest_names_first():
    with pytest.raises(InputError) as raised:
        resolve_device("a10")
    error = raised.value
    assert error.field == "--device"
    assert "unknown GPU 'a10'" in error.message
    known = error.message.split("known: ", 1)[1].split(", ")
    assert known[0].startswith("A100")
    assert {"cpu", "cuda"} | EXPECTED_NAMES <= set(known)
    assert "\n" not in str(error)


def test_cpu_device_has_no_gpu_and_no_overheads():
    device = resolve_device("CPU")
    assert device == Device(kind="cpu", name="cpu", source="generic")
    assert device.gpu is None
    assert device.context_bytes == 0 and device.cublas_workspace_bytes == 0
    assert device.memory_bytes is None


def test_cuda_without_a_gpu_is_generic_with_no_capacity(no_gpu):
    device = resolve_device("cuda")
    assert device.kind == "cuda"
    assert device.source == "generic"
    assert device.gpu is None
    assert device.memory_bytes is None
    assert "generic" in device.name
    assert device.context_bytes > 0
    assert device.cublas_workspace_bytes == 32 * MiB
    assert detect_gpus() == []


def test_cuda_with_a_catalog_gpu_present_uses_its_figures(one_gpu):
    one_gpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0))
    device = resolve_device("cuda")
    assert device.source == "detected"
    assert device.index == 0
    assert device.gpu.name == "A100-80GB"
    assert device.gpu.peak("bf16") == 312e12


def test_cuda_with_an_unknown_gpu_present_keeps_what_it_can_read(one_gpu):
    one_gpu("NVIDIA B200", 183359, (10, 0), sms=148)
    device = resolve_device("cuda:0")
    assert device.source == "detected"
    assert device.gpu.name == "NVIDIA B200"
    assert device.memory_bytes == 183359 * MiB
    assert device.gpu.compute_capability == (10, 0)
    assert device.gpu.peak("bf16") is None
    assert device.gpu.supports_bf16
    assert device.cublas_workspace_bytes == 32 * MiB


def test_cuda_index_beyond_the_present_gpus_is_an_input_error(one_gpu):
    one_gpu("NVIDIA L4", 23034, (8, 9))
    with pytest.raises(InputError):
        resolve_device("cuda:3")


@pytest.mark.parametrize("cuda_name, mib, expected", [
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-PCIe"),
    ("NVIDIA H200", 143771, "H200"),
    ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
    ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
    ("NVIDIA GeForce RTX 3090", 24576, "RTX-3090"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090"),
    ("NVIDIA L4", 23034, "L4"),
    ("Tesla T4", 15360, "T4"),
    ("NVIDIA H100 NVL", 95830, None),  # same chip, other memory: not the SXM entry
    ("NVIDIA L40S", 46068, None),  # "L4" is not a word of "L40S"
    ("NVIDIA GeForce RTX 4080", 16376, None),
])
def test_detected_names_match_the_catalog(cuda_name, mib, expected):
    gpu = match_catalog(cuda_name, mib * MiB)
    assert (gpu.name if gpu else None) == expected
