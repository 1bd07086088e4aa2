"""The parallel layout a Plan asks for: how many ranks go to each kind of parallelism.

Pure arithmetic, no torch.distributed: the engine builds its DeviceMesh from a Layout and
the estimate divides memory by it, so both read the same degrees.

Degrees the user leaves at 1 are filled from the world size: whatever `dp x fsdp x tp x pp`
leaves over goes to sharded data parallel when a ZeRO stage is named without --fsdp, else
to plain data parallel (DDP; replicas of the shard groups when --fsdp is named too). The
product of the degrees must then equal the world size.

What follows from the degrees is decided here once, for the engine and the estimate alike:
how data parallelism is done (`Layout.data_parallel_kind`) and how many rows one pipeline
chunk carries (`Layout.chunk_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from trainwise.common.errors import InputError
from trainwise.plan.partition import pipeline_microbatches


@dataclass(frozen=True)
class Layout:
    """Degrees of one run. `zero` is 0 without sharding (DDP or one device), else 1-3.

    Mesh dimensions, outermost first: pp, dp (replicas), fsdp (shards), tp. Tensor
    parallel is innermost so its frequent collectives stay between neighbouring ranks
    (same node), pipeline outermost because it sends the least.

    `microbatches`: the pipeline chunks one micro-batch is split into (1 without --pp);
    `chunk_batch`: the rows (sequences) of one such chunk, the whole micro-batch without
    --pp."""

    world: int
    dp: int
    fsdp: int
    tp: int
    pp: int
    zero: int
    cpu_offload: bool
    sequence_parallel: bool = False
    microbatches: int = 1
    chunk_batch: int = 1

    MESH_DIMS = ("pp", "dp", "fsdp", "tp")

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: replicas times shards."""
        return self.dp * self.fsdp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp, self.fsdp, self.tp)

    @property
    def is_distributed(self) -> bool:
        return self.world > 1

    @cached_property
    def data_parallel_kind(self) -> str:
        """How data parallelism is done: "none" (one data-parallel rank, no sharding),
        "ddp" (DistributedDataParallel), "zero1" (DDP with the optimizer states sharded by
        ZeroRedundancyOptimizer) or "fsdp" (FSDP2 fully_shard: ZeRO-2/3, and any data
        parallelism next to tensor or pipeline parallel, where FSDP2 replicates over dp
        because DDP does not compose with DTensor or pipeline stages).

        Raises InputError("--zero") for ZeRO-1 next to --tp, --pp or --dp."""
        if self.data_parallel == 1 and not self.zero:
            return "none"
        if self.zero == 1:
            if self.tp > 1 or self.pp > 1 or self.dp > 1:
                raise InputError("--zero", "ZeRO-1 runs on plain data parallel only; with --tp, --pp or --dp use "
                                           "--zero 2 or 3")
            return "zero1"
        if self.zero >= 2 or self.tp > 1 or self.pp > 1:
            return "fsdp"
        return "ddp"

    def describe(self) -> str:
        parts = [f"{name}={size}" for name, size in zip(self.MESH_DIMS, self.mesh_shape) if size > 1]
        if self.zero:
            parts.append(f"zero={self.zero}" + (" +offload" if self.cpu_offload else ""))
        if self.sequence_parallel:
            parts.append("sequence parallel")
        return f"{self.world} rank{'s' if self.world != 1 else ''}" + (f" ({', '.join(parts)})" if parts else "")


def resolve_layout(plan, world_size: int | None = None) -> Layout:
    """The Layout of `plan` on `world_size` ranks. The default is the plan's --nproc, or,
    when that is 1, the product of the named degrees (an estimate of `--fsdp 8` needs no
    --nproc; a launch passes its real world size).

    Raises InputError when the degrees cannot make up the world size or contradict each
    other."""
    dp, fsdp, tp, pp = plan.dp, plan.fsdp, plan.tp, plan.pp
    named = dp * fsdp * tp * pp
    world = world_size if world_size is not None else (plan.nproc if plan.nproc > 1 else named)
    sharded = plan.zero is not None or fsdp > 1
    if world % named:
        raise InputError("--nproc", f"must be a multiple of dp x fsdp x tp x pp = {dp} x {fsdp} x {tp} x {pp} "
                                    f"= {named} (got {world} processes)")
    left = world // named
    if left > 1:
        if sharded and fsdp == 1:
            fsdp = left
        elif dp == 1:  # replicas of the named groups (with --fsdp: hybrid sharding)
            dp = left
        else:
            raise InputError("--nproc", f"dp x fsdp x tp x pp = {dp} x {fsdp} x {tp} x {pp} = {named} must equal "
                                        f"the number of processes ({world})")
    zero = plan.zero if plan.zero is not None else (3 if fsdp > 1 else 0)
    if zero and fsdp == 1 and world > 1:
        raise InputError("--zero", f"shards over the --fsdp ranks, but all {world} ranks are taken by "
                                   f"dp x tp x pp; use --fsdp N in place of --dp N")
    if plan.cpu_offload and not zero:
        raise InputError("--cpu-offload", "needs sharded data parallel (--zero 2 or 3, or --fsdp N)")
    if plan.cpu_offload and zero == 1:
        raise InputError("--cpu-offload", "offloads sharded parameters: use --zero 2 or 3")
    if plan.sequence_parallel and tp == 1:
        raise InputError("--sequence-parallel", "shards over the tensor-parallel ranks: add --tp 2 or more")
    if plan.sequence_parallel and plan.seq_len % tp:
        raise InputError("--sequence-parallel", f"needs --seq-len divisible by --tp {tp}; got {plan.seq_len}")
    microbatches = pipeline_microbatches(plan, pp) if pp > 1 else 1
    return Layout(world=world, dp=dp, fsdp=fsdp, tp=tp, pp=pp, zero=zero, cpu_offload=plan.cpu_offload,
                  sequence_parallel=plan.sequence_parallel, microbatches=microbatches,
                  chunk_batch=plan.batch_size // microbatches)
