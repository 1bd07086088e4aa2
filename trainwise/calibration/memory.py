"""Calibration of memory-bound work: element-wise bandwidth, the eager per-op cost, the
optimizer step and copies between pinned host memory and a GPU, both directions.

Sizes are bytes read plus bytes written (an fp32 `a + b` of n elements moves 12 n bytes, a
bf16 one 6 n), the quantity the trace counts for element-wise and normalisation ops. The
rates are fitted on fp32 tensors; another dtype's is fp32's over its measured per-byte
slowdown (measure_bytes_relative): a CPU core spends about as long per element on bf16 as
on fp32, so where the data fits in cache bf16 moves fewer bytes per second."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainwise.calibration.timing import Fit, Settings, fit, measure_sizes, synchronizer, time_call, time_side_by_side
from trainwise.hardware.profile import Rate

FP32_BYTES = 4
HOST_OP_CALLS = 200  # tiny ops per sample of the per-op cost
# The element-wise dtypes a profile may hold rates for (trainwise/hardware/profile.py:
# byte_rate), by the names of trainwise/trace/op_costs.py.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def element_counts(device: torch.device, settings: Settings) -> list[int]:
    if device.type == "cuda":
        return [2**p for p in range(16, 29, 2)]
    return [2**p for p in (range(12, 19, 3) if settings.quick else range(14, 25, 2))]


# The ops each byte rate is measured on: (bytes read + written per element, in units of
# the element size; the op on tensors a, b and out of one dtype).
BYTE_OPS = {
    "memory": ((3, lambda a, b, out: torch.add(a, b, out=out)), (2, lambda a, b, out: torch.mul(a, 0.5, out=out)),
               (2, lambda a, b, out: out.copy_(a))),
    # exp, tanh, SiLU, and a log-softmax over rows of 1024 with its backward (the loss of a
    # language model): their arithmetic, not memory, sets the pace on a CPU core.
    "transcendental": ((2, lambda a, b, out: torch.exp(a, out=out)), (2, lambda a, b, out: torch.tanh(a, out=out)),
                       (2, lambda a, b, out: torch.nn.functional.silu(a)), (5, lambda a, b, out: _log_softmax_forward_backward(a, b, out))),
    # dropout's mask, `bernoulli_(1 - p)` in place: reads and writes the element size.
    "random": ((2, lambda a, b, out: out.bernoulli_(0.9)),),
}


def measure_bytes(kind: str, device: torch.device, settings: Settings) -> Fit:
    """The Rate (bytes read + written, as the trace counts them) of the fp32 ops of `kind`
    (BYTE_OPS: "memory", "transcendental" or "random") over sizes."""
    sync, cases = synchronizer(device), []
    for n in element_counts(device, settings):
        for per_element, op in BYTE_OPS[kind]:
            if n >= 1024 or per_element != 5:  # the log-softmax's rows are 1024 long
                cases.append((per_element * n * FP32_BYTES, _binary(n, device, "fp32", op)))
    return fit(measure_sizes(cases, sync, settings))


def measure_bytes_relative(kind: str, dtype: str, device: torch.device, settings: Settings) -> tuple[float, dict]:
    """How much longer the ops of `kind` take per byte on `dtype` tensors than on fp32 ones:
    the median, over each op at every other size of the fp32 fit, of the two timed side by
    side, their samples taken in turn ((seconds / bytes) on `dtype` over the same on fp32);
    and what was timed.

    A ratio of like ops at like sizes, not a fit of its own: one line through the sizes
    mixes cache-resident and DRAM-bound points and ops of different speed (a bf16 copy is a
    memcpy, a bf16 add converts every element). In one-off timings on the project's 2-core
    EPYC (busy) a bf16 fit came out 10-15 % under fp32's while bf16 add and scale ran 2-3x
    slower per byte than fp32's where the tensors fit in cache (a CPU core spends about as
    long per element on either) and about at par beyond."""
    sync, pairs = synchronizer(device), []
    scale = FP32_BYTES / DTYPES[dtype].itemsize
    for n in element_counts(device, settings)[::2]:
        for per_element, op in BYTE_OPS[kind]:
            if n < 1024 and per_element == 5:
                continue
            # Side by side, sample for sample: timed one after the other, a drift in the
            # machine's speed between the two went into the ratio (at 4 Mi elements on the
            # project's 2-core EPYC the same op's ratio read 0.2 in one calibration and 2.8
            # in another, and the median over the ops moved from 1.5 to 2.6 with it).
            fp32, other = time_side_by_side([_binary(n, device, name, op)() for name in ("fp32", dtype)], sync, settings)
            pairs.append((n, per_element, other.seconds / fp32.seconds * scale, max(fp32.spread, other.spread)))
    ratio = statistics.median(p[2] for p in pairs)
    return ratio, {"ratio": ratio, "spread": max(p[3] for p in pairs),
                   "pairs": [{"elements": n, "bytes_per_element": e, "ratio": r} for n, e, r, _ in pairs]}


def _log_softmax_forward_backward(a, b, out):
    """Forward (reads a, writes y) and backward (reads the gradient and y, writes one)."""
    rows = a.view(-1, 1024)
    y = torch._log_softmax(rows, -1, False)
    return torch._log_softmax_backward_data(b.view(-1, 1024), y, -1, a.dtype)


def _binary(n: int, device: torch.device, dtype: str, op):
    def make():
        a, b, out = (torch.rand(n, device=device, dtype=DTYPES[dtype]) for _ in range(3))
        return lambda: op(a, b, out)
    return make


def measure_host_overhead(device: torch.device, settings: Settings) -> tuple[float, float]:
    """Seconds one tiny eager op costs (dispatch plus, on a GPU, its launch; the device
    waits for the host when this is longer than the kernel), and the spread."""
    sync = synchronizer(device)
    a, b = torch.ones(8, device=device), torch.ones(8, device=device)

    def ops():
        for _ in range(HOST_OP_CALLS):
            torch.add(a, b)

    timing = time_call(ops, sync, settings)
    return timing.seconds / HOST_OP_CALLS, timing.spread


def measure_optimizer(device: torch.device, settings: Settings) -> Fit:
    """torch.optim.AdamW (foreach) steps on fp32 parameters, a Rate on the bytes its ops
    read and write as the trace counts them (trainwise/trace/op_costs.py), so the time
    model prices a traced optimizer phase with it."""
    sync = synchronizer(device)
    counts = [2**p for p in ((12, 14, 16) if settings.quick else (14, 16, 18, 20, 22))]
    if device.type == "cuda":
        counts = [2**p for p in (18, 20, 22, 24, 26)]

    def make_optimizer(total: int):
        params = [torch.nn.Parameter(torch.rand(total // 8, device=device)) for _ in range(8)]
        for p in params:
            p.grad = torch.rand_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        optimizer.step()  # creates the moments: their allocation is not a step's cost
        return optimizer

    def case(total: int):
        return traced_work(make_optimizer(total).step)[0], lambda: make_optimizer(total).step

    found = fit(measure_sizes([case(total) for total in counts], sync, settings))
    # The fit's fixed cost is a whole step's; the time model pays it per traced kernel.
    kernels = traced_work(make_optimizer(counts[0]).step)[1]
    return dataclasses.replace(found, rate=Rate(found.rate.per_s, found.rate.fixed_s / max(kernels, 1)))


def traced_work(work, op_class: str | None = None) -> tuple[int, int]:
    """(bytes read + written, kernels: ops other than views) of the ops `work()`
    dispatches, as the trace counts them; only those of `op_class` where one is named."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainwise.trace.op_costs import OpCostRecorder

    recorder = OpCostRecorder(torch.nn.Module())

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outputs = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
            recorder.record(func, args, kwargs, out, outputs, "optimizer", "")
            return out

    with torch.no_grad(), Counting():
        work()
    costs = recorder.costs
    if op_class is not None:
        return costs.total(2, op_class=op_class) + costs.total(3, op_class=op_class), costs.total(0, op_class=op_class)
    return costs.total(2) + costs.total(3), costs.total(0) - costs.total(0, op_class="metadata")


COPY_DIRECTIONS = ("host_to_device", "device_to_host")


def copy_sizes(settings: Settings) -> list[int]:
    """Bytes per copy: 64 KiB to 256 MiB; the fit's throughput is the large copies' rate
    (the small ones set its fixed cost)."""
    return [2**p for p in ((16, 20, 24) if settings.quick else (16, 18, 20, 22, 24, 26, 28))]


def measure_copy(device: torch.device, direction: str, settings: Settings, pinned: bool = True) -> Fit:
    """Copies between pinned host memory and `device` (a GPU), one direction
    (COPY_DIRECTIONS): a Rate on bytes. `pinned` False for a device without pinned memory
    (a test on the CPU)."""
    copy_ends(1, device, direction, pinned)  # a direction not named is refused before any timing
    sync = synchronizer(device)

    def case(nbytes: int):
        def make():
            source, destination = copy_ends(nbytes, device, direction, pinned)
            return lambda: destination.copy_(source, non_blocking=True)
        return nbytes, make

    return fit(measure_sizes([case(n) for n in copy_sizes(settings)], sync, settings))


def copy_ends(nbytes: int, device: torch.device, direction: str, pinned: bool = True):
    """(source, destination) of one copy of `nbytes` in `direction`."""
    if direction not in COPY_DIRECTIONS:
        raise ValueError(f"direction {direction!r}: one of {COPY_DIRECTIONS}")
    host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    host = host.pin_memory() if pinned else host
    target = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    return (host, target) if direction == "host_to_device" else (target, host)
