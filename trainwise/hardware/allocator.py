"""Whether the C allocator hands freed memory back to the system, for a training process on the CPU.

PyTorch's CPU tensors come from the C library's malloc. glibc's malloc serves a large
request with a fresh mmap and unmaps it when freed (the threshold rises with use, to at
most 32 MiB), and gives the top of its heap back to the system once 128 KiB or more lie
free there (that limit rising with use too). A training step frees its activations and gradients every step and allocates
them again the next, so each step touched fresh pages that the kernel had to fault in and
zero: on this project's 2-core CPU, tiny-llama at 8 x 256 tokens took about 3,000 page
faults a step and GPT-2 at 4 x 128 about 360,000 (1.5 GB), and keeping the memory left 0
or 1 and made the steps 17 % and 13 % faster (`benchmarks/allocator_faults.py --rounds
5`: the medians of five neighbouring pairs of fresh processes). PyTorch's CPU tuning advice
is to swap in jemalloc or tcmalloc for this reason; glibc does the same job when told to
keep what it frees: no mmap for allocations (the heap serves them; a failed heap growth
still falls back to mmap) and no trimming of the heap's top. The process then keeps its
peak heap until it exits, which a training run reaches every step anyway.

The switch is process-wide, so it is applied where a CPU step is run or measured:
`trainwise train` on the CPU and `trainwise calibrate --device cpu`, the latter so that a
profile prices the step `train` runs. A user's own choice wins: with jemalloc, tcmalloc or
mimalloc preloaded, or any of glibc's MALLOC_* or GLIBC_TUNABLES settings in the
environment, nothing is changed, and profiles record which setting they were measured
under (hardware/profile_settings.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
# The largest trim threshold mallopt takes (an int): never trim in practice.
_NEVER_TRIM = 2**31 - 1

KEPT = "glibc, freed memory kept"
GLIBC_DEFAULT = "glibc default"
USER_GLIBC = "glibc, the environment's MALLOC_* settings"
NOT_GLIBC = "the system's allocator (not glibc)"
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_",
                "MALLOC_ARENA_MAX")
_PRELOADABLE = ("jemalloc", "tcmalloc", "mimalloc")

_applied: str | None = None  # what keep_freed_memory set in this process


def allocator_setting(environ: dict | None = None, libc: str | None = None) -> str:
    """The allocator setting a trainwise CPU run uses in this environment (`environ`,
    default os.environ; `libc`, default this Python's C library): a preloaded allocator by
    name, glibc under the environment's settings, KEPT, or NOT_GLIBC."""
    environ = os.environ if environ is None else environ
    preloaded = environ.get("LD_PRELOAD", "")
    for name in _PRELOADABLE:
        if name in preloaded:
            return f"{name} (LD_PRELOAD)"
    libc = platform.libc_ver()[0] if libc is None else libc
    if libc != "glibc":
        return NOT_GLIBC
    if any(environ.get(name) for name in _ENVIRONMENT) or "malloc" in environ.get("GLIBC_TUNABLES", ""):
        return USER_GLIBC
    return KEPT


def allocator_in_force() -> str:
    """The setting keep_freed_memory applied in this process, or, before it ran, the one it
    would apply: what a CPU profile is measured and checked under."""
    return _applied if _applied is not None else allocator_setting()


def keep_freed_memory() -> str:
    """Apply allocator_setting() to this process (once; later calls return what was set):
    under KEPT, glibc's mallopt serves allocations from the heap and never trims it. Returns
    the setting in force, GLIBC_DEFAULT when glibc refused the change."""
    global _applied
    if _applied is not None:
        return _applied
    setting = allocator_setting()
    if setting == KEPT:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # Both or neither: setting the trim threshold alone also fixes glibc's rising mmap
        # threshold at its start (128 KiB), and every tensor above it would then be mapped
        # and faulted in afresh each step (twice the step on tiny-llama).
        if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)):
            setting = GLIBC_DEFAULT
    _applied = setting
    return setting
