"""The storages of a traced step: each one's record, and the events that make and free it.
Plain data without torch: trainwise/trace/recorder.py records them on fake tensors, and the
estimate replays them (trainwise/estimator/anatomy.py, memory.py, extrapolate.py), also
from the trace cache, where no torch is imported."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.trace.block_ids import NO_BLOCK

ALLOC, FREE = "alloc", "free"  # the kinds of a StepTrace's (kind, storage key) events
# What a storage is, settled after the step (trainwise/trace/step_trace.py); a storage that
# is none of the others is a temporary.
CATEGORIES = ("weights", "buffers", "gradients", "optimizer", "activations", "temporary")
# The `op` of the record of a host copy --activation-offload makes (trainwise/trace/step_trace.py
# marks them; the estimate counts them as host memory and copy traffic).
OFFLOADED_OP = "activation_offload"


@dataclass
class StorageRecord:
    """One storage the step created. `category` (one of CATEGORIES) is settled after the step."""

    key: int
    nbytes: int
    phase: str
    module: str
    op: str
    saved_in: set[str] = field(default_factory=set)  # phases in which autograd saved it
    category: str = "temporary"
    owner: int = NO_BLOCK  # the repeated block it belongs to (an index of StepTrace.blocks)
    # Kept in host memory even when the parameters are on an accelerator (see step_trace.py).
    host_resident: bool = False
