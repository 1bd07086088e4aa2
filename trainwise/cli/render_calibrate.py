"""The table `trainwise calibrate` prints: each measured rate with its unit."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.hardware.profile import Rate


def rate_rows(profile) -> list[tuple[str, str, str]]:
    """(what, throughput with unit, fixed cost per op in µs) for every rate of `profile`."""
    rows = [(f"matmul {dtype}", _tflops(rate), _micro(rate.fixed_s)) for dtype, rate in profile.matmul.items()]
    rows += [(f"attention {dtype}{head_dim} (fwd+bwd)", _tflops(rate), _micro(rate.fixed_s))
             for dtype, head_dim, rate in _attention_rates(profile)]
    rows += _byte_rows(profile)
    dispatch = profile.measured.get("host_dispatch_s_per_op")
    if dispatch is not None:  # the CPU: the bare dispatch, and an op's host time in a training step
        rows.append(("host per eager op (bare dispatch)", "-", _micro(dispatch)))
        rows.append(("host per op in a training step", "-", _micro(profile.host_s_per_op)))
        if profile.host_s_per_recomputed_op is not None:
            rows.append(("host per op recomputed by checkpointing", "-", _micro(profile.host_s_per_recomputed_op)))
        if profile.host_s_per_selective_recomputed_op is not None:
            rows.append(("host per op recomputed by selective checkpointing", "-",
                         _micro(profile.host_s_per_selective_recomputed_op)))
        rows.append((f"training step vs the rates above: matmul and attention x "
                     f"{profile.step_compute_factor * profile.step_contraction_factor:.2f}, other work but the "
                     f"optimizer x {profile.step_compute_factor * profile.step_non_matmul_factor:.2f}", "-", "-"))
    else:
        rows.append(("host per eager op", "-", _micro(profile.host_s_per_op)))
    if profile.optimizer:
        rows.append(("AdamW step (bytes its ops read + write)", _gbs(profile.optimizer.per_s),
                     _micro(profile.optimizer.fixed_s)))
    rows += [(f"{name.replace('_', '-')} (bytes sent per rank)", _gbs(rate.per_s), _micro(rate.fixed_s))
             for name, rate in profile.collectives.items()]
    if profile.host_to_device:
        rows.append(("host to device (pinned)", _gbs(profile.host_to_device.per_s),
                     _micro(profile.host_to_device.fixed_s)))
    if profile.device_to_host:
        rows.append(("device to host (pinned)", _gbs(profile.device_to_host.per_s),
                     _micro(profile.device_to_host.fixed_s)))
    if profile.host_s_per_compiled_kernel is not None:
        rows.append(("host per kernel a compiled region launches", "-", _micro(profile.host_s_per_compiled_kernel)))
    if profile.host_s_per_compiled_region is not None:
        rows.append(("host per call into a compiled region", "-", _micro(profile.host_s_per_compiled_region)))
    if profile.compiled_random is not None:
        rows.append(("random numbers in a compiled region, fp32 (bytes read + written)",
                     _gbs(profile.compiled_random.per_s), _micro(profile.compiled_random.fixed_s)))
    if profile.context_bytes is not None:
        rows.append(("CUDA context and loaded kernels (device memory outside the allocator)",
                     f"{profile.context_bytes / 2**20:.0f} MiB", "-"))
    return rows


BYTE_KIND_NAMES = {"memory": "memory", "transcendental": "exp, tanh, softmax...",
                   "random": "random numbers, dropout's mask"}


def _byte_rows(profile) -> list[tuple[str, str, str]]:
    """The element-wise rates, fp32's and each other dtype's calibrate measured."""
    rows = []
    for kind, name in BYTE_KIND_NAMES.items():
        rates = {"fp32": getattr(profile, kind), **profile.byte_rates_by_dtype.get(kind, {})}
        rows += [(f"{name} {dtype} (bytes read + written)", _gbs(rate.per_s), _micro(rate.fixed_s))
                 for dtype, rate in rates.items() if rate is not None]
    return rows


def _attention_rates(profile) -> list[tuple[str, str, Rate]]:
    """(dtype, ", head dim D" or "", rate): by head dim where the profile measured head dims."""
    rates = []
    for dtype, rate in profile.attention.items():
        by_head_dim = profile.attention_by_head_dim.get(dtype, {})
        rates += [(dtype, f", head dim {dim}", by_head_dim[dim]) for dim in sorted(by_head_dim)] or [(dtype, "", rate)]
    return rates


def _tflops(rate: Rate) -> str:
    return f"{rate.per_s / 1e12:.3g} TFLOP/s"


def _gbs(per_s: float) -> str:
    return f"{per_s / 1e9:.3g} GB/s"


def _micro(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} µs"


def render_calibration(result) -> None:
    profile = result.profile
    measured = profile.measured
    table = Table(title=f"{profile.device_name}: measured in {result.seconds:.0f} s "
                        f"(median of {measured.get('repeats_per_size')} repeats per size, "
                        f"{measured.get('torch_threads')} threads, {measured.get('clock', 'wall')} seconds; "
                        "estimate uses it at this thread count only)", title_justify="left")
    for column, justify in (("rate", "left"), ("throughput", "right"), ("fixed cost per op", "right"),
                            ("source", "left")):
        table.add_column(column, justify=justify)
    for what, throughput, fixed in rate_rows(profile):
        table.add_row(what, throughput, fixed, "measured")
    console = Console()
    console.print(table)
    why = measured.get("compiled_host", {}).get("why")
    if why:
        console.print(f"torch.compile host costs: {why}")
    why = measured.get("compiled_random", {}).get("why")
    if why:
        console.print(f"random numbers in a compiled region: {why}")
    moved = measured.get("steadiness", {}).get("ratio")
    if moved is not None:
        console.print(f"steadiness (measured): the reference training steps took {moved:.2f} x as long at the end "
                      "of the calibration as when the profile was fitted (1.00: the machine ran at one speed)")
    console.print(f"an op of size x takes fixed cost + x / throughput; profile written to {result.path}")
