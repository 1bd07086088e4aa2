"""What a traced step does, read at full depth, before a device profile prices it
(estimator/step_time.py): the op table and the bytes --activation-offload copies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from trainwise.estimator.activation_offload_time import OffloadTraffic, offload_traffic
from trainwise.plan.plan import Plan
from trainwise.trace.depth import DepthFit, extrapolate_by_kind
from trainwise.trace.op_table import OpCosts
from trainwise.trace.step_trace_data import StepTrace


@dataclass(frozen=True)
class StepWork:
    """What a traced step does, read at full depth, before a device profile prices it: the
    op table (trainwise/trace/op_table.py) and, under --activation-offload, the bytes each
    micro-batch copies to the host. The trace cache (estimator/trace_cache.py) keeps it, so a
    profile calibrated later prices a cached step as it prices a fresh one."""

    costs: OpCosts
    offload: OffloadTraffic | None = None


def step_work(traces: Sequence[StepTrace], fit: DepthFit | None, plan: Plan) -> StepWork:
    """The step's work from one full-depth trace (`fit` None), or from traces at
    `fit.depths` blocks read at full depth per layer kind (trainwise/trace/depth.py)."""
    if fit is not None:
        costs = full_depth_costs([t.op_costs for t in traces], fit)
    else:
        costs = traces[-1].op_costs
    return StepWork(costs, offload_traffic(traces, fit) if plan.activation_offload else None)


def full_depth_costs(costs: Sequence[OpCosts], fit: DepthFit) -> OpCosts:
    """Every row's sums read at full depth from the traced depths (time, like memory and
    FLOPs, is a fixed part plus a per-block part for each layer kind)."""
    def read(table: str) -> dict:
        rows = {}
        # In the order the traces first met each row, not a set's: the step time adds the
        # rows up in this order, and a set's follows the process's string hashes (the last
        # digits of an estimate changed from one run of the same command to the next).
        for key in dict.fromkeys(k for c in costs for k in getattr(c, table)):
            columns = zip(*(getattr(c, table).get(key, [0, 0, 0, 0]) for c in costs))
            rows[key] = [max(0, extrapolate_by_kind(list(values), fit)) for values in columns]
        return rows
    return OpCosts(read("rows"), read("compiled"))
