"""Compiled scatter-adds on a CPU with more than one thread: run PyTorch's own kernel.

The backward of indexing a tensor with an index tensor (Falcon's fused query-key-value
projection picks its key and value heads that way) is an index_put that adds into a zeroed
gradient. Inductor's C++ backend writes it as an atomic add when the kernel runs on more
than one thread. Where that kernel also reads a transposed tile (the key's gradient coming
out of the score matmul), torch 2.13 adds the tile's inner offset twice: gradients land on
the wrong rows, and past the buffer's end. The fix is in no release tried here, so the
switch below is applied on every torch trainwise supports. Measured on this project's
2-core CPU with torch 2.13 (`python benchmarks/compiled_scatter_add.py --models small-falcon
--runs 30`): a Falcon config compiled block by block had its query-key-value weight's
gradient off by 5.2 % of its largest entry against the eager step (8.9e-7 with `--threads
1`), and 2 of 30 fresh 12-step runs stopped on a NaN loss; by hand, runs also died of a
segmentation fault or glibc's "malloc assertion failure". PyTorch's issue is
pytorch/pytorch#191837, its fix pytorch/pytorch#191861.

Inductor lowers an accumulating index_put to ATen's own kernel when deterministic
algorithms are on, so that is the switch: on for the process, warn-only (a kernel without a
deterministic implementation warns, it does not stop the run as `--deterministic` does),
and without deterministic mode's NaN fill of every fresh buffer. Nothing else about the
compiled step changes what it computes. The switch is applied before the first compile
(engine/compile_regions.py, for `train` and for calibrate's compiled reference steps alike)
and the run says so (engine/job.py). tests/test_compile_atomic_add.py compiles the reduced
case in a fresh process: it fails once an installed torch no longer needs the switch."""

from __future__ import annotations

import torch

NOTE = ("compiled on the CPU with {threads} threads: scatter-adds (index backward) run PyTorch's own kernel, "
        "deterministic algorithms on, warn-only; inductor's generated one writes them to the wrong rows with more "
        "than one thread in torch 2.13 (pytorch/pytorch#191837)")

_applied_threads: int | None = None  # the thread count the switch was applied at, once applied


def needs_switch(device_type: str) -> bool:
    """Whether a compile for `device_type` in this process meets the bug: a CPU compile on
    more than one thread, deterministic algorithms off (on, inductor already falls back)."""
    return device_type == "cpu" and torch.get_num_threads() > 1 and not torch.are_deterministic_algorithms_enabled()


def run_scatter_adds_in_aten(device_type: str) -> bool:
    """Turn the switch on where needs_switch(device_type); returns whether this call did."""
    global _applied_threads
    if not needs_switch(device_type):
        return False
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode would also fill every torch.empty with NaN: the step's buffers are
    # all written before they are read, and the fill costs a pass over each of them.
    torch.utils.deterministic.fill_uninitialized_memory = False
    _applied_threads = torch.get_num_threads()
    return True


def switch_note() -> str | None:
    """The line a run shows when this process turned the switch on, else None."""
    return NOTE.format(threads=_applied_threads) if _applied_threads is not None else None
