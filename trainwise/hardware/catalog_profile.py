"""A catalog GPU's profile: its vendor figures times assumed efficiency factors, for the
step-time model where no calibration of that GPU exists (trainwise/hardware/profile.py's
`profile_for` falls back to it). Its times are named "catalog figures x assumed
efficiencies" wherever they are shown (CATALOG_RATES)."""

from __future__ import annotations

from trainwise.hardware.device import Device
from trainwise.hardware.profile import COLLECTIVES, GB_S, DeviceProfile
from trainwise.hardware.rate import Rate

# Fractions of the vendor peak that tuned kernels reach on large shapes. These are
# ASSUMPTIONS, not measurements of this project: round figures in line with what public
# kernel reports show (cuBLAS GEMMs near 70 % of dense peak on A100/H100 at transformer
# sizes; flash-attention 2/3 50-75 % forward and less backward, one factor for both;
# element-wise kernels near 80 % of DRAM bandwidth; NCCL bus bandwidth near 75 % of NVLink's
# figure; PCIe near 80 %). docs/plan.md ("Device profiles") lists them as assumptions and the
# estimate says so next to every catalog-based time (CATALOG_RATES); they were checked
# against published runs in docs/results/time-model-published.md, not fitted to them.
MATMUL_EFFICIENCY = 0.70
ATTENTION_EFFICIENCY = 0.50
BANDWIDTH_EFFICIENCY = 0.80
NVLINK_EFFICIENCY = 0.75
PCIE_EFFICIENCY = 0.80
# Per-op fixed costs on a GPU: a kernel's launch-to-finish floor, and the host time eager
# PyTorch spends dispatching one op (the GPU idles when the host is slower than it).
KERNEL_FIXED_S = 4e-6
EAGER_HOST_S_PER_OP = 12e-6
COLLECTIVE_LATENCY_S = 20e-6
# PCIe between host and GPU, one direction of an x16 link, by generation (the catalog's
# `pcie_gen`, from each board's datasheet), in GB/s, decimal: half the both-directions
# figure vendors print (Gen3 32, Gen4 64, Gen5 128 GB/s).
PCIE_GB_S = {3: 16.0, 4: 32.0, 5: 64.0}


def catalog_profile(device: Device) -> DeviceProfile | None:
    """Vendor figures times the efficiency factors above; None for a device without
    catalog figures (the CPU, generic CUDA)."""
    gpu = device.gpu
    if gpu is None or not gpu.memory_bandwidth:
        return None
    rates = {k: v for k, v in gpu.peak_flops.as_dict().items() if v and k != "int8"}
    matmul = {k: Rate(v * MATMUL_EFFICIENCY, KERNEL_FIXED_S) for k, v in rates.items()}
    attention = {k: Rate(v * ATTENTION_EFFICIENCY, KERNEL_FIXED_S) for k, v in rates.items() if k != "fp8"}
    collectives = {}
    if gpu.interconnect:
        # The catalog's NVLink figure sums both directions; a ring's bus bandwidth is one.
        link = Rate(gpu.interconnect / 2 * NVLINK_EFFICIENCY, COLLECTIVE_LATENCY_S)
        collectives = {name: link for name in COLLECTIVES}
    pcie = PCIE_GB_S.get(gpu.pcie_gen)
    # One DRAM bandwidth for element-wise work of every dtype (no byte_rates_by_dtype): a
    # GPU's element-wise kernels are bound by the bytes they move, whatever their dtype.
    return DeviceProfile(device_name=gpu.name, kind="cuda", source="catalog", matmul=matmul,
                         attention=attention, memory=Rate(gpu.memory_bandwidth * BANDWIDTH_EFFICIENCY, KERNEL_FIXED_S),
                         host_s_per_op=EAGER_HOST_S_PER_OP, collectives=collectives,
                         host_to_device=Rate(pcie * GB_S * PCIE_EFFICIENCY, 10e-6) if pcie else None)
