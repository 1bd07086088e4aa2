"""The GPU catalog: vendor figures for the GPUs people train on, and lookup by name.

Peak rates are the vendors' *dense* figures (datasheets print "with sparsity" numbers
that are twice these). Memory is the total nvidia-smi shows for the board, in MiB.
"""

from __future__ import annotations

import re

from trainwise.hardware.cuda_overheads import cublas_workspace_bytes, estimate_context_bytes
from trainwise.hardware.gpu import GPU, PeakFlops

MiB = 1024**2
TERA = 1e12
GB_S = 1e9  # vendors quote bandwidth in decimal GB/s


def _gpu(name, *, memory_mib, capability, sm_count, max_threads_per_sm, peak,
         bandwidth_gb_s, nvlink_gb_s, pcie_gen, aliases=()) -> GPU:
    return GPU(
        name=name,
        aliases=tuple(aliases),
        memory_bytes=memory_mib * MiB,
        context_bytes=estimate_context_bytes(sm_count, max_threads_per_sm),
        cublas_workspace_bytes=cublas_workspace_bytes(capability),
        compute_capability=capability,
        peak_flops=peak,
        memory_bandwidth=bandwidth_gb_s * GB_S,
        interconnect=nvlink_gb_s * GB_S if nvlink_gb_s else None,
        sm_count=sm_count,
        max_threads_per_sm=max_threads_per_sm,
        pcie_gen=pcie_gen,
    )


def _tflops(**rates) -> PeakFlops:
    return PeakFlops(**{k: (v * TERA if v is not None else None) for k, v in rates.items()})


# NVIDIA V100 (SXM2) datasheet: 15.7 TFLOPS fp32, 125 TFLOPS tensor (fp16 only),
# 900 GB/s HBM2, NVLink 300 GB/s, PCIe Gen3 (32 GB/s both directions). No bf16/tf32/fp8
# paths; the datasheet lists no int8 tensor-core rate. nvidia-smi: 16160 MiB / 32510 MiB.
_V100 = dict(capability=(7, 0), sm_count=80, max_threads_per_sm=2048,
             peak=_tflops(fp32=15.7, fp16=125.0), bandwidth_gb_s=900, nvlink_gb_s=300, pcie_gen=3)

# NVIDIA A100 (SXM4) datasheet: 19.5 fp32, 156 tf32, 312 fp16/bf16, 624 TOPS int8 (dense);
# HBM2 1,555 GB/s (40 GB) or HBM2e 2,039 GB/s (80 GB); NVLink 600 GB/s; PCIe Gen4.
_A100 = dict(capability=(8, 0), sm_count=108, max_threads_per_sm=2048,
             peak=_tflops(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0, int8=624.0),
             nvlink_gb_s=600, pcie_gen=4)

# NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 dense: 66.9 fp32,
# 494.7 tf32, 989.4 fp16/bf16, 1978.9 fp8, 1978.9 TOPS int8; HBM3 3.35 TB/s;
# NVLink 900 GB/s; PCIe Gen5. 132 SMs. nvidia-smi: 81559 MiB.
_H100_SXM_PEAK = _tflops(fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9,
                         int8=1978.9)

_CATALOG: tuple[GPU, ...] = (
    _gpu("V100-16GB", memory_mib=16160, aliases=("V100", "V100-SXM2-16GB", "Tesla-V100-16GB"),
         **_V100),
    _gpu("V100-32GB", memory_mib=32510, aliases=("V100-SXM2-32GB", "Tesla-V100-32GB"), **_V100),
    _gpu("A100-40GB", memory_mib=40960, aliases=("A100-SXM4-40GB",), bandwidth_gb_s=1555,
         **_A100),
    _gpu("A100-80GB", memory_mib=81920, aliases=("A100", "A100-SXM4-80GB", "A100-SXM"),
         bandwidth_gb_s=2039, **_A100),
    _gpu("H100-80GB", memory_mib=81559, aliases=("H100", "H100-SXM", "H100-SXM5", "H100-SXM-80GB"),
         capability=(9, 0), sm_count=132, max_threads_per_sm=2048, peak=_H100_SXM_PEAK,
         bandwidth_gb_s=3350, nvlink_gb_s=900, pcie_gen=5),
    # H100 PCIe datasheet: 51 fp32, 378 tf32, 756 fp16/bf16, 1513 fp8, 1513 TOPS int8
    # (dense); HBM2e 2.0 TB/s; NVLink bridge 600 GB/s; PCIe Gen5. 114 SMs.
    _gpu("H100-PCIe", memory_mib=81559, aliases=("H100-PCIE-80GB",),
         capability=(9, 0), sm_count=114, max_threads_per_sm=2048,
         peak=_tflops(fp32=51.0, tf32=378.0, fp16=756.0, bf16=756.0, fp8=1513.0, int8=1513.0),
         bandwidth_gb_s=2000, nvlink_gb_s=600, pcie_gen=5),
    # H200 SXM datasheet: same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s; NVLink
    # 900 GB/s; PCIe Gen5. nvidia-smi: 143771 MiB.
    _gpu("H200", memory_mib=143771, aliases=("H200-141GB", "H200-SXM"),
         capability=(9, 0), sm_count=132, max_threads_per_sm=2048, peak=_H100_SXM_PEAK,
         bandwidth_gb_s=4800, nvlink_gb_s=900, pcie_gen=5),
    # GA102 (Ampere GeForce) whitepaper, RTX 3090 dense: 35.6 fp32, 35.6 tf32,
    # 71 fp16/bf16 with fp32 accumulate (GeForce runs fp32-accumulate at half the fp16-
    # accumulate rate), 284 TOPS int8; GDDR6X 936 GB/s; NVLink bridge 112.5 GB/s; PCIe Gen4.
    _gpu("RTX-3090", memory_mib=24576, aliases=("3090", "GeForce-RTX-3090"),
         capability=(8, 6), sm_count=82, max_threads_per_sm=1536,
         peak=_tflops(fp32=35.6, tf32=35.6, fp16=71.0, bf16=71.0, int8=284.0),
         bandwidth_gb_s=936, nvlink_gb_s=112.5, pcie_gen=4),
    # Ada Lovelace whitepaper, RTX 4090 dense: 82.6 fp32, 82.6 tf32, 165.2 fp16/bf16 and
    # 330.3 fp8 with fp32 accumulate, 660.6 TOPS int8; GDDR6X 1,008 GB/s; no NVLink; PCIe Gen4.
    _gpu("RTX-4090", memory_mib=24564, aliases=("4090", "GeForce-RTX-4090"),
         capability=(8, 9), sm_count=128, max_threads_per_sm=1536,
         peak=_tflops(fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2, fp8=330.3, int8=660.6),
         bandwidth_gb_s=1008, nvlink_gb_s=None, pcie_gen=4),
    # NVIDIA L4 datasheet (dense = half the sparsity figures): 30.3 fp32, 60 tf32,
    # 121 fp16/bf16, 242.5 fp8, 242.5 TOPS int8; GDDR6 300 GB/s; PCIe Gen4 x16.
    # nvidia-smi: 23034 MiB.
    _gpu("L4", memory_mib=23034, aliases=("NVIDIA-L4",),
         capability=(8, 9), sm_count=58, max_threads_per_sm=1536,
         peak=_tflops(fp32=30.3, tf32=60.0, fp16=121.0, bf16=121.0, fp8=242.5, int8=242.5),
         bandwidth_gb_s=300, nvlink_gb_s=None, pcie_gen=4),
    # NVIDIA T4 datasheet: 8.1 fp32, 65 fp16 (mixed precision), 130 TOPS int8; no bf16 or
    # tf32; GDDR6 320 GB/s; PCIe Gen3 x16. nvidia-smi: 15360 MiB.
    _gpu("T4", memory_mib=15360, aliases=("Tesla-T4",),
         capability=(7, 5), sm_count=40, max_threads_per_sm=1024,
         peak=_tflops(fp32=8.1, fp16=65.0, int8=130.0),
         bandwidth_gb_s=320, nvlink_gb_s=None, pcie_gen=3),
)


def catalog() -> tuple[GPU, ...]:
    """Every GPU in the catalog, oldest architecture first."""
    return _CATALOG


def normalize_name(name: str) -> str:
    """Case- and separator-insensitive key: "a100_80gb", "A100-80GB" -> "A10080GB"."""
    return re.sub(r"[\s_\-.]+", "", name).upper()


def _index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _CATALOG:
        for spelling in (gpu.name, *gpu.aliases):
            index[normalize_name(spelling)] = gpu
    return index


_BY_NAME = _index()


def find_gpu(name: str) -> GPU | None:
    """The catalog GPU called `name` (or one of its aliases), or None."""
    return _BY_NAME.get(normalize_name(name))


def gpu_names() -> tuple[str, ...]:
    """Catalog names, in catalog order (aliases left out)."""
    return tuple(gpu.name for gpu in _CATALOG)


def all_spellings() -> dict[str, str]:
    """Normalized name or alias -> catalog name, for suggestions."""
    return {key: gpu.name for key, gpu in _BY_NAME.items()}
