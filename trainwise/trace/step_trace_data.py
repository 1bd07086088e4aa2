"""The data of a step trace: StepTrace, what tracing one training step gives
(trainwise/trace/step_trace.py traces it) and every estimate reads. Plain data without
torch, so that an estimate read back from the trace cache (trainwise/estimator/trace_cache.py)
imports no torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainwise.trace.op_table import OpCosts
from trainwise.trace.storage import StorageRecord


@dataclass
class StepTrace:
    """Every allocation of one training step, in program order.

    `events` are (alloc|free, storage key) pairs; `records[key]` says how big each storage
    was, which phase and module created it and its category. Events before `window_start`
    set up the state the measured step starts from (weights, optimizer state); peaks are
    read from the window only, as a long training run's peak is a steady-state step's.

    `blocks` lists the repeated blocks of the model as (stack name, position);
    `event_blocks[i]` is the block running at event i (-1: none) and `records[key].owner`
    the block a storage belongs to (see trainwise/trace/blocks.py)."""

    events: list[tuple[str, int]]
    records: list[StorageRecord]
    window_start: int
    phase_starts: list[tuple[str, int]]  # (phase, first event index) inside the window
    params: int
    trainable_params: int
    micro_steps_traced: int
    target_device_type: str
    event_blocks: list[int] = field(default_factory=list)
    blocks: list[tuple[str, int]] = field(default_factory=list)
    # Every op's work after setup, summed by kind (trainwise/trace/op_costs.py), as the
    # traced plan runs it (compiled regions priced as fused kernels under --compile).
    op_costs: OpCosts = field(default_factory=OpCosts)
    # The same ops priced with --compile off (False) and on (True, per the plan's
    # compile_scope), those the trace recorded: compile changes what the ops cost, not
    # which ops run or what they allocate, so a plan and its compile twin share one trace.
    op_costs_by_compile: dict[bool, OpCosts] = field(default_factory=dict)


def priced_as(trace: StepTrace, compiled: bool) -> StepTrace:
    """`trace` with its ops priced as the step runs them with --compile on or off (KeyError
    when the trace did not record that pricing: trace_training_step's `compiled_pricing`)."""
    costs = trace.op_costs_by_compile[compiled]
    return trace if costs is trace.op_costs else dataclasses.replace(trace, op_costs=costs)
