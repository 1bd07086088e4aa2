"""FSDP2's communication in one optimizer step (ZeRO-2/3, and the plain replication the
engine uses for data parallel next to tensor or pipeline parallel), exposed and
overlapped, as engine/parallel/fsdp.py configures it (trainwise/plan/fsdp_settings.py).

One unit per block and a root unit for the rest. In forward each block's parameters are
all-gathered (compute dtype) one block ahead (FSDP2's implicit prefetch), so a gather hides
behind the previous block's compute and shows only where it is longer; the first one is
exposed. ZeRO-3 gathers again in backward, the same way. On the last micro-batch of the step
(the engine turns gradient sync off before it) each block's gradients are reduce-scattered
over the shard group (and, with replicas, all-reduced over them) while the next block's
backward runs; the last block's and the root's reduction run after the backward, exposed.
A block's backward thus hides its gather and reduction together when they fit in it: both
share the rank's link. Under pipeline parallel the stages keep gathered parameters across
a micro-batch's chunks, so gathers are counted once per micro-batch."""

from __future__ import annotations

from trainwise.estimator.layout_collectives import CollectiveTime, Groups
from trainwise.estimator.rank_work import RankWork


def _prefetched(comm_s: float, compute_s: float, units: int) -> float:
    """Exposed seconds of `units` transfers, each prefetched behind the previous unit's
    compute: the first in full, then what each exceeds its compute by."""
    if units == 0 or comm_s == 0:
        return 0.0
    return comm_s + (units - 1) * max(comm_s - compute_s, 0.0)


def fsdp_collectives(work: RankWork, groups: Groups, zero3: bool) -> list[CollectiveTime]:
    blocks = max(work.blocks, 1)
    trainable = work.trainable_params / work.params if work.params else 0.0
    block_params = work.params_in_blocks / blocks
    root_params = work.params - work.params_in_blocks
    shards = groups.size["fsdp"]
    # One unit's gather: its all-gather, and before it torchao's scale all-reduce per float8 weight.
    amax = groups.seconds("all_reduce", 4, "fsdp")
    gather_root = groups.seconds("all_gather", work.root_unit_gather_bytes, "fsdp") + work.amax_reductions_root * amax
    gather_block = (groups.seconds("all_gather", work.one_block_gather_bytes, "fsdp")
                    + work.amax_reductions_per_block * amax)
    scatter = lambda n: groups.seconds("reduce_scatter", n * trainable * work.reduce_bytes, "fsdp")  # noqa: E731
    replicas = lambda n: groups.seconds("all_reduce", n * trainable * work.reduce_bytes / shards, "dp")  # noqa: E731
    forward_block = work.forward_s * work.chunks / blocks
    backward_block = work.backward_s * work.chunks / blocks
    accumulate = work.grad_accum
    # Forward, every micro-batch: the root unit (embedding) first, then the blocks.
    forward_total = gather_root + blocks * gather_block
    forward_exposed = gather_root + _prefetched(gather_block, forward_block, blocks)
    # Backward of the micro-batches before the last: ZeRO-3's gathers only.
    regather = gather_block if zero3 else 0.0
    plain_exposed = _prefetched(regather, backward_block, blocks)
    # The last micro-batch's backward: gathers and reductions share the link.
    reduce_block = scatter(block_params) + replicas(block_params)
    reduce_root = scatter(root_params) + replicas(root_params)
    load = regather + reduce_block
    overflow = (blocks - 1) * max(load - backward_block, 0.0)  # what the blocks' backward cannot hide
    gathers_total = accumulate * (forward_total + blocks * regather)
    gathers_exposed = (accumulate * forward_exposed + (accumulate - 1) * plain_exposed
                       + regather + (overflow * regather / load if load else 0.0))
    reduce_total = blocks * reduce_block + reduce_root
    reduce_exposed = reduce_block + reduce_root + (overflow * reduce_block / load if load else 0.0)
    return _entries(work, groups, zero3, gathers_total, gathers_exposed, reduce_total, reduce_exposed,
                    trainable)


def _entries(work: RankWork, groups: Groups, zero3: bool, gathers_total: float, gathers_exposed: float,
             reduce_total: float, reduce_exposed: float, trainable: float) -> list[CollectiveTime]:
    """The step's FSDP2 collectives by kind, the reduction's exposure split between the
    shard group's reduce-scatter and the replicas' all-reduce by their time."""
    shards, replicas = groups.size["fsdp"], groups.size["dp"]
    blocks = max(work.blocks, 1)
    gathered = work.grad_accum * (work.root_unit_gather_bytes + blocks * work.one_block_gather_bytes * (2 if zero3 else 1))
    gradient_bytes = work.params * trainable * work.reduce_bytes
    entries = []
    if shards > 1:
        when = "forward and backward" if zero3 else "forward"
        entries.append(CollectiveTime("all_gather", f"FSDP2 parameter all-gather ({when})", gathered,
                                      groups.link["fsdp"].name, gathers_exposed, max(gathers_total - gathers_exposed, 0.0)))
    scatter_s = groups.seconds("reduce_scatter", gradient_bytes, "fsdp")
    replica_s = groups.seconds("all_reduce", gradient_bytes / shards, "dp")
    split = scatter_s / (scatter_s + replica_s) if scatter_s + replica_s else 0.0
    if shards > 1:
        entries.append(CollectiveTime("reduce_scatter", "FSDP2 gradient reduce-scatter", gradient_bytes,
                                      groups.link["fsdp"].name, reduce_exposed * split,
                                      max(reduce_total - reduce_exposed, 0.0) * split))
    if replicas > 1:
        entries.append(CollectiveTime("all_reduce", "FSDP2 gradient all-reduce across replicas",
                                      gradient_bytes / shards, groups.link["dp"].name, reduce_exposed * (1 - split),
                                      max(reduce_total - reduce_exposed, 0.0) * (1 - split)))
    return entries
