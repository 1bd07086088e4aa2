"""Device memory a PyTorch process uses besides its tensors: CUDA context and cuBLAS workspace.

Both numbers feed `device_total` (what nvidia-smi shows) and `peak_reserved`:

* the CUDA context lives outside PyTorch's caching allocator, so it is added on top of
  `max_memory_reserved()`;
* the cuBLAS workspace is allocated *through* the caching allocator, so it is one more
  allocation in the allocator model.
"""

from __future__ import annotations

MiB = 1024**2

# --- CUDA context -------------------------------------------------------------------
#
# What we know (public measurements, not ours):
# * PyTorch sets CUDA_MODULE_LOADING=LAZY since 1.13 (pytorch/pytorch#86509). That PR
#   measured 287 MB for a process holding one small tensor, against 667 MB with eager
#   loading.
# * NVIDIA engineers on the PyTorch tracker quote "around 300-400 MB" for the context with
#   CUDA >= 11.7 and lazy loading (pytorch/pytorch#107667, #109888).
# * A bare context of torch 2.10 + CUDA 13 on an RTX 6000 Ada measured 426 MiB in
#   nvidia-smi (unslothai/unsloth-zoo#1053).
#
# The context grows with the GPU's size because the driver reserves local memory (the
# per-thread stack, 1 KiB by default, cudaLimitStackSize) for every thread that can be
# resident at once: SMs x max threads per SM. A training step then lazily loads the
# kernel images it uses (cuBLAS, cuDNN, attention, optimizer kernels) on top of the
# bare context.
#
# Our estimate is therefore   base + SMs x threads/SM x 1 KiB,   with the base chosen so
# that an A100 comes to ~500 MiB after a training step. It is an estimate, labelled as such
# wherever it is shown; a profile of the GPU written by `trainwise calibrate` holds the
# measured figure (trainwise/calibration/context.py), which the memory estimate uses instead.
CONTEXT_BASE_BYTES = 300 * MiB
STACK_BYTES_PER_THREAD = 1024  # CUDA's default cudaLimitStackSize


def estimate_context_bytes(sm_count: int, max_threads_per_sm: int) -> int:
    """Estimated CUDA context + lazily loaded kernel images of a training process, in bytes.

    Rounded up to 2 MiB (the granularity at which the driver maps device memory).
    """
    local_memory = sm_count * max_threads_per_sm * STACK_BYTES_PER_THREAD
    total = CONTEXT_BASE_BYTES + local_memory
    granule = 2 * MiB
    return -(-total // granule) * granule


# --- cuBLAS workspace -----------------------------------------------------------------
#
# Facts from pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp
# (parseChosenWorkspaceSize / getChosenWorkspaceSize, torch 2.x):
# * the default CUBLAS_WORKSPACE_CONFIG is ":4096:2:16:8", i.e. 2 x 4096 KiB + 8 x 16 KiB
#   = 8,519,680 bytes;
# * on Hopper the default is 32 MiB (4096 KiB x 8). Releases up to about 2.8 test for
#   exactly sm_90; newer sources (with torch.backends.cuda.cublas_workspace_size, as in
#   the torch 2.13 we pin) use 32 MiB for compute capability majors 9, 10, 11 and 12.
# * the workspace is allocated with the CUDA caching allocator, once per (cuBLAS handle,
#   stream) pair, and kept for the life of the process. Handles are per thread, and the
#   autograd engine runs CUDA backward on its own device thread, so a training step
#   usually holds two workspaces: one for forward, one for backward.
# * cuBLASLt: torch 2.13 documents the "unified" workspace as the default on open-source
#   CUDA builds (torch.backends.cuda.blas_workspace_size): Lt reuses the cuBLAS
#   allocation, so it adds nothing. Older 2.x releases allocated a separate 1 MiB
#   (CUBLASLT_WORKSPACE_SIZE default, 1024 KiB) Lt workspace per handle and stream.
DEFAULT_CUBLAS_WORKSPACE_BYTES = 2 * 4096 * 1024 + 8 * 16 * 1024  # 8,519,680
LARGE_CUBLAS_WORKSPACE_BYTES = 8 * 4096 * 1024  # 32 MiB
_LARGE_WORKSPACE_MAJORS = (9, 10, 11, 12)


def cublas_workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """Bytes of one cuBLAS workspace (per handle and stream) under torch's defaults."""
    major, _minor = compute_capability
    if major in _LARGE_WORKSPACE_MAJORS:
        return LARGE_CUBLAS_WORKSPACE_BYTES
    return DEFAULT_CUBLAS_WORKSPACE_BYTES
