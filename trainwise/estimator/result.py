"""EstimateResult: what an estimate predicts for one plan on one device, and its JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.estimator.memory import MemoryEstimate
from trainwise.estimator.step_time import StepTime
from trainwise.estimator.step_work import StepWork
from trainwise.hardware import Device
from trainwise.hardware.profile import CATALOG_RATES
from trainwise.plan.plan import Plan


_METHODS = {"repeated": "repeating blocks", "per-kind": "layer kind"}


@dataclass(frozen=True)
class EstimateResult:
    """A prediction for one plan on one device. Memory in bytes; counts in parameters."""

    model: str
    task: str
    params: int
    trainable_params: int
    device: Device
    plan: Plan
    memory: MemoryEstimate
    activations_by_module: dict[str, int]  # saved-activation bytes per module (traced blocks)
    # Block counts really traced when extrapolated (2 and 3; one more per extra layer kind
    # when blocks differ by design, trainwise/trace/depth.py), else None.
    traced_blocks: tuple[int, ...] | None
    total_blocks: int | None
    notes: tuple[str, ...] = field(default=())
    # How the traced blocks were extrapolated: "repeated" (the 3-block timeline written out
    # at full depth and replayed), "line" (figures on a line through the 2- and 3-block
    # results, where the blocks do not repeat cleanly), "per-kind" (blocks that differ by
    # design: each figure read per layer kind, trainwise/trace/depth.py), None when not
    # extrapolated.
    extrapolation: str | None = None
    # Under a parallel layout: the degrees, and every pipeline rank's figures (`memory` is
    # rank 0's); None on one device.
    layout: dict | None = None
    # The predicted step time (trainwise/estimator/step_time.py); None without a device
    # profile (the CPU before `trainwise calibrate`, a GPU the catalog lacks).
    time: StepTime | None = None
    # One device: the traced step's work before pricing (estimator/step_time.py), which the
    # trace cache keeps; None under a layout. `from_cache`: read from that cache, not traced.
    work: StepWork | None = field(default=None, compare=False, repr=False)
    from_cache: bool = field(default=False, compare=False)

    @property
    def fits(self) -> bool | None:
        """Whether device_total fits the device's memory; None when the capacity is unknown."""
        capacity = self.device.memory_bytes
        return None if capacity is None else self.memory.device_total <= capacity

    @property
    def traced_text(self) -> str:
        """"2 and 3 of 32" (or "2, 3 and 6 of 26"): the depths traced, of the full depth."""
        depths = [str(n) for n in self.traced_blocks or ()]
        listed = ", ".join(depths[:-1]) + " and " + depths[-1] if len(depths) > 1 else "".join(depths)
        return f"{listed} of {self.total_blocks}"

    def to_json(self) -> dict:
        capacity = self.device.memory_bytes
        memory = self.memory.to_json()
        memory["device_capacity"] = capacity
        memory["context_source"] = self.device.context_source
        return {"model": self.model, "task": self.task, "params": self.params,
                "trainable_params": self.trainable_params, "device": self.device.kind,
                "device_name": self.device.name, "device_source": self.device.source,
                "plan": self.plan.to_dict(), "memory": memory, "fits": self.fits,
                **({"layout": self.layout} if self.layout else {}),
                "method": "predicted: traced on fake tensors" + (
                    f" ({self.traced_text} blocks, extrapolated"
                    f" by {_METHODS.get(self.extrapolation, 'a line')})"
                    if self.traced_blocks else ""),
                "time": self._time_json(), "notes": list(self.notes)}

    def _time_json(self) -> dict | None:
        if self.time is None:
            return None
        source = CATALOG_RATES if self.time.source == "catalog" else f"the profile {self.time.source}"
        method = f"predicted: the traced step's ops at the rates of {source} for {self.device.name}"
        return {**self.time.to_json(), "method": method}
