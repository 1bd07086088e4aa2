"""The collectives one rank of a layout runs in an optimizer step, each with its exposed
and overlapped seconds, modelled on what the engine does (trainwise/engine/parallel/).

Mesh order (trainwise/plan/layout.py): pp, dp, fsdp, tp, tp innermost, so rank 0's group
of a dimension is its ranks `stride` apart, the stride being the product of the inner
degrees (collective_time.Topology decides from that whether the group spans nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainwise.estimator.collective_time import Link, Topology, collective_seconds, group_link
from trainwise.estimator.rank_work import RankWork
from trainwise.hardware.profile import DeviceProfile
from trainwise.plan.layout import Layout

# DistributedDataParallel's default bucket_cap_mb (25 MiB); the engine passes none.
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class CollectiveTime:
    """One kind of collective of the step: bytes each rank sends into it per optimizer
    step (before the ring's (n-1)/n factors), the link, and its seconds on and off the
    critical path."""

    name: str  # "all_reduce", "all_gather", "reduce_scatter", "send_recv"
    purpose: str
    bytes_per_step: float
    link: str
    exposed_s: float
    overlapped_s: float

    def to_json(self) -> dict:
        return {"name": self.name, "purpose": self.purpose, "bytes_per_step": round(self.bytes_per_step),
                "link": self.link, "exposed_s": self.exposed_s, "overlapped_s": self.overlapped_s}


class Groups:
    """Rank 0's groups of each mesh dimension and their links."""

    def __init__(self, layout: Layout, profile: DeviceProfile, topology: Topology):
        strides = {"tp": 1, "fsdp": layout.tp, "dp": layout.tp * layout.fsdp,
                   "pp": layout.tp * layout.fsdp * layout.dp}
        sizes = {"tp": layout.tp, "fsdp": layout.fsdp, "dp": layout.dp, "pp": layout.pp}
        self.size = sizes
        self.link: dict[str, Link] = {dim: group_link(profile, topology, sizes[dim], strides[dim]) for dim in sizes}
        # Neighbouring pipeline stages are `stride` ranks apart: on another node once that
        # reaches a node's size (pairs straddling a node boundary below that are ignored).
        self.link["pp"] = group_link(profile, topology, 2, strides["pp"])

    def seconds(self, kind: str, nbytes: float, dim: str) -> float:
        ranks = 2 if kind == "send_recv" else self.size[dim]
        return collective_seconds(kind, nbytes, ranks, self.link[dim])


def tensor_parallel(work: RankWork, layout: Layout, groups: Groups) -> list[CollectiveTime]:
    """Megatron-style TP (engine/parallel/tensor_parallel.py): per block, the attention's and
    the MLP's row-wise outputs are all-reduced in forward and the column-wise inputs'
    gradients in backward (2 + 2), the forward's two again in each block checkpointing
    recomputes (every block, or every k-th with --grad-ckpt-every k); the
    vocab-parallel embedding all-reduces its output, the head's input gradient is
    all-reduced. Under sequence parallel each all-reduce becomes an all-gather plus a
    reduce-scatter of the same whole tensor (same volume). All on the critical path: the
    next op needs the result."""
    if layout.tp == 1:
        return []
    count = work.blocks * 4 + work.recomputed_blocks * 2 + work.has_embedding + work.has_head
    chunks = work.grad_accum * work.chunks
    nbytes = work.activation_bytes
    if layout.sequence_parallel:
        kinds = [("all_gather", "TP sequence-parallel all-gather"), ("reduce_scatter", "TP sequence-parallel "
                                                                                         "reduce-scatter")]
    else:
        kinds = [("all_reduce", "TP activation all-reduce")]
    return [CollectiveTime(kind, purpose, count * chunks * nbytes, groups.link["tp"].name,
                           count * chunks * groups.seconds(kind, nbytes, "tp"), 0.0) for kind, purpose in kinds]


def pipeline_p2p(work: RankWork, layout: Layout, groups: Groups, stages_per_rank: int) -> list[CollectiveTime]:
    """torch.distributed.pipelining sends each chunk's activations to the next stage and
    its gradient back. Counted exposed: a stage's forward waits for its input and its
    backward for its gradient, one message per chunk, direction and stage of the rank.
    Under sequence parallel each tensor-parallel rank sends its slice of the sequence to
    its peer (engine/parallel/pipeline_parallel.py): 1/tp of the activation."""
    if layout.pp == 1:
        return []
    messages = 2 * stages_per_rank * work.chunks * work.grad_accum
    nbytes = work.activation_bytes // layout.tp if layout.sequence_parallel else work.activation_bytes
    seconds = messages * groups.seconds("send_recv", nbytes, "pp")
    return [CollectiveTime("send_recv", "PP activations and gradients between stages" + (
        " (sequence slices)" if layout.sequence_parallel else ""), messages * nbytes, groups.link["pp"].name,
        seconds, 0.0)]


def bucketed_overlap(bucket_seconds: list[float], backward_s: float) -> float:
    """Exposed seconds of gradient buckets reduced one after another on one stream, bucket i
    ready when (i + 1) / k of the backward is done: what runs past the backward's end."""
    finish, count = 0.0, len(bucket_seconds)
    for index, seconds in enumerate(bucket_seconds):
        finish = max(finish, backward_s * (index + 1) / count) + seconds
    return max(finish - backward_s, 0.0)


def ddp_all_reduce(work: RankWork, groups: Groups, dim: str, purpose: str) -> CollectiveTime:
    """DDP (engine/parallel/data_parallel.py): gradients in 25 MiB buckets, each all-reduced
    as soon as backward fills it, on the last micro-batch only (no_sync before it), so all
    but what runs past the backward's end (at least the last bucket) hides behind it."""
    total = work.trainable_params * work.reduce_bytes
    buckets = max(1, math.ceil(total / DDP_BUCKET_BYTES))
    sizes = [DDP_BUCKET_BYTES] * (buckets - 1) + [total - DDP_BUCKET_BYTES * (buckets - 1)]
    seconds = [groups.seconds("all_reduce", size, dim) for size in sizes]
    exposed = bucketed_overlap(seconds, work.backward_s * work.chunks)
    return CollectiveTime("all_reduce", purpose, total, groups.link[dim].name, exposed, sum(seconds) - exposed)


def zero_one(work: RankWork, groups: Groups) -> list[CollectiveTime]:
    """ZeRO-1 (ZeroRedundancyOptimizer on DDP): DDP's bucketed all-reduce, then each rank
    updates its partition and broadcasts it: all-gather volume of the weights, after the
    optimizer step, exposed."""
    reduce = ddp_all_reduce(work, groups, "fsdp", "ZeRO-1 gradient all-reduce (DDP buckets)")
    nbytes = work.params * work.weight_bytes
    seconds = groups.seconds("all_gather", nbytes, "fsdp")
    return [reduce, CollectiveTime("all_gather", "ZeRO-1 broadcast of updated parameters", nbytes,
                                   groups.link["fsdp"].name, seconds, 0.0)]
