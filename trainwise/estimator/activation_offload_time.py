"""The time --activation-offload adds to a step: the blocks' saved tensors copied to host
memory in forward (profile.device_to_host_rate) and back in backward (profile.host_to_device),
priced as the engine overlaps them (trainwise/techniques/activation_offload.py):

* device to host runs on a side stream beside the forward: exposed only where it outlasts
  the forward's device work;
* host to device: the first block backward reaches waits for its own copy (exposed); every
  other block's copy is prefetched during the backward of the block after it, exposed only
  where the copies outlast the backward's device work.

The two directions share one copy stream, so the copies back also wait behind any of the
forward's copies still running (counted in the forward's excess). On the CPU nothing
moves: no time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from trainwise.hardware.profile import GB_S, DeviceProfile
from trainwise.trace.depth import DepthFit, extrapolate_by_kind
from trainwise.trace.step_trace_data import StepTrace
from trainwise.trace.storage import ALLOC, OFFLOADED_OP


@dataclass(frozen=True)
class OffloadTraffic:
    """Bytes one micro-batch moves each way: all blocks, and the last block's share."""

    per_micro_batch: int
    last_block: int


def offload_traffic(traces: Sequence[StepTrace], fit: DepthFit | None) -> OffloadTraffic:
    """Bytes of host copies per micro-batch at full depth (a line through the traced depths
    like every other figure) and one block's share (the slope per block)."""
    per_trace = [_copied_bytes(t) // max(t.micro_steps_traced, 1) for t in traces]
    if fit is None:
        blocks = max(len(traces[-1].blocks), 1)
        return OffloadTraffic(per_trace[-1], per_trace[-1] // blocks)
    total = max(0, extrapolate_by_kind(per_trace, fit))
    slope = per_trace[-1] - per_trace[-2] if len(per_trace) > 1 else per_trace[-1]
    return OffloadTraffic(total, max(0, slope))


def activation_offload_seconds(traffic: OffloadTraffic, phase_seconds: dict[str, float], micro_batches: int,
                               profile: DeviceProfile) -> tuple[float, str]:
    """(exposed seconds per step, note). `phase_seconds`: device seconds of one micro-batch's
    forward and backward (recomputation included)."""
    back, out = profile.host_to_device, profile.device_to_host_rate
    if back is None or traffic.per_micro_batch == 0:
        return 0.0, "activation offload: nothing moves on this device (the saved tensors stay where they are)"
    forward_copies, backward_copies = out.seconds(traffic.per_micro_batch), back.seconds(traffic.per_micro_batch)
    forward_excess = max(0.0, forward_copies - phase_seconds.get("forward", 0.0))
    first_block = back.seconds(traffic.last_block)
    rest = max(0.0, backward_copies - first_block)
    backward_excess = max(0.0, rest - phase_seconds.get("backward", 0.0))
    exposed = micro_batches * (forward_excess + first_block + backward_excess)
    note = (f"activation offload: {traffic.per_micro_batch / 2**20:.1f} MiB each way per micro-batch over PCIe "
            f"({(forward_copies + backward_copies) * 1e3:.2f} ms of copies a micro-batch; "
            f"{copy_rates_text(profile)}), overlapped with compute except "
            f"{exposed / micro_batches * 1e3:.2f} ms (the first block of backward waits for its copy)")
    return exposed, note


def copy_rates_text(profile: DeviceProfile) -> str:
    """The host-device copy rates and where each came from, for every note that uses them
    (activation offload's, CPU offload's)."""
    if profile.host_to_device is None:
        return "no host-device copies on this device"
    origin = "measured" if profile.rates_measured else "catalog PCIe figure x assumed efficiency"
    there = f"host to device {profile.host_to_device.per_s / GB_S:.3g} GB/s ({origin})"
    if profile.device_to_host is not None:
        return f"{there}, device to host {profile.device_to_host.per_s / GB_S:.3g} GB/s ({origin})"
    return f"{there}, device to host assumed the same (not measured)"


def _copied_bytes(trace: StepTrace) -> int:
    """Bytes of host copies made inside the measured window."""
    made = set()
    for index, (kind, key) in enumerate(trace.events):
        if index >= trace.window_start and kind == ALLOC and trace.records[key].op == OFFLOADED_OP:
            made.add(key)
    return sum(trace.records[key].nbytes for key in made)
