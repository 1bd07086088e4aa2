"""A GPU model: capacity, overheads, and peak rates, as the estimators need them."""

from __future__ import annotations

from dataclasses import dataclass, fields

# Spellings people use for each dtype, mapped to the catalog's keys.
_DTYPE_KEYS = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "tf32": "tf32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "int8": "int8", "torch.int8": "int8",
}

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
# float8 (e4m3/e5m2) tensor-core matmuls arrived with Ada (sm89) and Hopper (sm90).
FLOAT8_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class PeakFlops:
    """Peak dense rates in FLOP/s (OP/s for int8); None where the GPU has no such path.

    fp16/bf16/fp8 are tensor-core rates with fp32 accumulation (what training uses);
    fp32 is the non-tensor-core rate; tf32 the tensor-core rate for fp32 matmuls.
    """

    fp32: float | None = None
    tf32: float | None = None
    fp16: float | None = None
    bf16: float | None = None
    fp8: float | None = None
    int8: float | None = None

    def get(self, dtype: str) -> float | None:
        """Peak rate for `dtype` ("bf16", "bfloat16", "torch.bfloat16", ...), or None."""
        key = _DTYPE_KEYS.get(str(dtype).lower())
        if key is None:
            raise KeyError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        return getattr(self, key)

    def as_dict(self) -> dict[str, float | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class GPU:
    """One GPU model. Byte counts are bytes, rates are per second.

    memory_bytes: total device memory as nvidia-smi reports it.
    context_bytes: device memory the process uses outside PyTorch's caching allocator
        (CUDA context + kernel images); an estimate, see cuda_overheads.py.
    cublas_workspace_bytes: one cuBLAS workspace, allocated through the caching
        allocator per (handle, stream); see cuda_overheads.py.
    memory_bandwidth: peak DRAM bandwidth, bytes/s (None when unknown).
    interconnect: peak NVLink bandwidth per GPU, both directions summed, bytes/s;
        None without NVLink.
    pcie_gen: the PCI Express generation of the board's x16 host link, from its datasheet
        (the host-device copy rate of offload, and the link between GPUs without NVLink).
    source: where the figures come from, shown next to any number derived from them.
    """

    name: str
    memory_bytes: int
    context_bytes: int
    cublas_workspace_bytes: int
    compute_capability: tuple[int, int]
    peak_flops: PeakFlops
    memory_bandwidth: float | None
    interconnect: float | None
    sm_count: int | None = None
    max_threads_per_sm: int | None = None
    pcie_gen: int | None = None
    aliases: tuple[str, ...] = ()
    source: str = "catalog"

    @property
    def supports_bf16(self) -> bool:
        """bf16 tensor cores arrived with Ampere (sm80)."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_tf32(self) -> bool:
        """TF32 tensor cores arrived with Ampere (sm80)."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_flash_attention(self) -> bool:
        """FlashAttention-2 (and PyTorch's flash SDPA backend) need sm80 or newer."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_float8(self) -> bool:
        """float8 (e4m3/e5m2) tensor-core matmuls arrived with Ada (sm89) and Hopper (sm90)."""
        return self.compute_capability >= FLOAT8_CAPABILITY

    def peak(self, dtype: str) -> float | None:
        """Peak dense FLOP/s for `dtype`, or None when unsupported or unknown."""
        return self.peak_flops.get(dtype)
