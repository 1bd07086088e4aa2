"""Calibration of the host time under torch.compile: per kernel a compiled region launches
and per call into a region (trainwise/trace/fusion.py prices a compiled step with them;
without a measurement, hardware/profile.py's COMPILED_*_HOST_S figures).

A chain of B tiny blocks (`x @ w`, then `tanh(x) * 0.5 + x`) is compiled whole, one
region, and its forward and backward (`torch.autograd.grad`, so no gradient is
accumulated outside the region) timed at a few B. Counted as fusion.py counts a compiled
region's kernels, each block launches KERNELS_PER_BLOCK: forward its matmul and one fused
element-wise kernel, backward one fused kernel and two matmuls (input and weight
gradients). Up to 16 blocks, so the line is read over hundreds of microseconds, not the
noise of one call. The tensors are 16 x 16, so the kernels' arithmetic is a few FLOPs and
the time is the host's:

    seconds(B) = 2 x region + B x (KERNELS_PER_BLOCK x kernel + device work of a block)

A line through the timed points gives the slope (a block's seconds) and the intercept (the
forward and backward calls into the region, the autograd engine's entry into backward
included: a step pays it too). The device work is what the time model adds on its own
for the block's kernels at the profile's rates; on the CPU it runs on the host, between
the launches, so it is taken out of the slope; on a GPU the host queues ahead of kernels
this small and the wall time is the host's, so nothing is taken out."""

from __future__ import annotations

import torch

from trainwise.calibration.timing import Settings, fit_rate, synchronizer, time_call
from trainwise.hardware.profile import DeviceProfile

WIDTH = 16
MATMULS_PER_BLOCK = 3  # forward x @ w; backward the input's and the weight's gradients
FUSED_PER_BLOCK = 2  # forward tanh(x) * 0.5 + x; backward its gradient
KERNELS_PER_BLOCK = MATMULS_PER_BLOCK + FUSED_PER_BLOCK
REGION_CALLS = 2  # forward and backward


class _Block(torch.nn.Module):
    def __init__(self, device: torch.device, width: int = WIDTH):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, width, device=device) / width)

    def forward(self, x):
        x = x @ self.weight
        return torch.tanh(x) * 0.5 + x


def block_counts(settings: Settings) -> tuple[int, ...]:
    return (1, 8) if settings.quick else (1, 8, 16)


def measure_compiled_host(device: torch.device, profile: DeviceProfile, settings: Settings) -> dict:
    """{"kernel_s", "region_s", "points": [[blocks, seconds]], ...}: host seconds per
    compiled kernel and per region call on `device`, the device work of `profile`'s rates
    taken out on the CPU. Compiles len(block_counts) chains (seconds each). Where
    torch.compile fails here (no C++ compiler for the CPU, no Triton for a GPU), nothing is
    measured and "why" says so: the rest of the profile stands."""
    import torch._dynamo

    try:
        points = timed_chains(device, settings)
    except Exception as err:  # noqa: BLE001 - inductor fails in many ways without its toolchain
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        return {"points": [], "kernels_per_block": KERNELS_PER_BLOCK, "kernel_s": None, "region_s": None,
                "why": f"torch.compile failed on this machine ({type(err).__name__}: {reason}): nothing measured"}
    finally:
        torch._dynamo.reset()  # the chains' compiled code is not kept past the measurement
    return compiled_host_costs(points, block_device_seconds(profile) if device.type == "cpu" else 0.0)


def timed_chains(device: torch.device, settings: Settings, width: int = WIDTH) -> list[tuple[int, float]]:
    """(blocks, seconds of one forward and backward) of each compiled chain of `width` x
    `width` blocks (calibrate's: WIDTH; benchmarks/compiled_kernel_sizes.py tries others)."""
    sync, points = synchronizer(device), []
    for blocks in block_counts(settings):
        chain = torch.nn.Sequential(*(_Block(device, width) for _ in range(blocks)))
        compiled = torch.compile(chain)
        x = torch.randn(width, width, device=device, requires_grad=True)
        inputs, grad = [x, *chain.parameters()], torch.ones(width, width, device=device)

        def step():
            torch.autograd.grad(compiled(x), inputs, grad)

        step()  # compiles forward and backward: not a call's cost
        points.append((blocks, time_call(step, sync, settings).seconds))
    return points


def block_device_seconds(profile: DeviceProfile, width: int = WIDTH) -> float:
    """What the time model prices one block's kernels at, device work only: the matmuls at
    the fp32 rate, the fused kernels at the memory rate on the bytes they read and write."""
    matmul, element = profile.matmul_rate("fp32"), profile.memory
    fused_bytes = 4 * width * width * 4  # forward reads x, writes y; backward reads two, writes one
    return (MATMULS_PER_BLOCK * matmul.seconds(2 * width**3)
            + FUSED_PER_BLOCK * element.fixed_s + fused_bytes / element.per_s)


def compiled_host_costs(points: list[tuple[int, float]], device_s_per_block: float) -> dict:
    """Per-kernel and per-region-call host seconds from (blocks, seconds of forward and
    backward) points. A figure the points cannot give is None, with "why" (the built-in
    figure then stands): the kernel's where the time does not grow with the blocks or the
    block's device work as priced leaves the host nothing; the region's where the line
    meets zero time at no blocks."""
    points = sorted(points)
    found = {"points": [[blocks, seconds] for blocks, seconds in points], "kernels_per_block": KERNELS_PER_BLOCK,
             "device_s_per_block": device_s_per_block, "kernel_s": None, "region_s": None}
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        found["why"] = "the time did not grow with the blocks (a busy machine): nothing measured"
        return found
    line = fit_rate([(float(blocks), seconds) for blocks, seconds in points])
    per_block = 1.0 / line.per_s
    kernel = (per_block - device_s_per_block) / KERNELS_PER_BLOCK
    found.update(seconds_per_block=per_block, kernel_s=kernel if kernel > 0 else None,
                 region_s=line.fixed_s / REGION_CALLS if line.fixed_s > 0 else None)
    why = []
    if kernel <= 0:
        why.append(f"a block took {per_block * 1e6:.3g} us, no more than the {device_s_per_block * 1e6:.3g} us its "
                   "kernels' device work is priced at: no host time per kernel left")
    if line.fixed_s <= 0:
        why.append("the line through the points meets zero seconds at no blocks: no region call time")
    if why:
        found["why"] = "; ".join(why)
    return found
