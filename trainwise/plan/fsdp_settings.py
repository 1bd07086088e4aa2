"""How FSDP2 is configured for a layout: the one object the engine shards with
(engine/parallel/fsdp.py) and the per-rank estimate sizes the communication buffers from
(trainwise/estimator/per_rank.py), so a change here changes both.

Pure facts, no torch: the engine turns them into fully_shard's arguments."""

from __future__ import annotations

from dataclasses import dataclass

# FSDP2 prefetches implicitly: the all-gather of the next block is issued while the current
# one computes, one block ahead, in forward and in backward. The engine sets no explicit
# prefetch, so this is the depth it runs with.
FSDP2_IMPLICIT_PREFETCH_BLOCKS = 1


@dataclass(frozen=True)
class FsdpSettings:
    """`reshard_after_forward`: free each block's gathered parameters after its forward and
    gather them again in backward (ZeRO-3), else keep them from forward to backward (ZeRO-2,
    and plain replication next to tensor or pipeline parallel). `gathers_bf16`: under bf16
    mixed precision FSDP2 gathers bf16 copies of the fp32 shards to compute with and
    reduce-scatters gradients in fp32; otherwise it computes and reduces in the weights'
    own dtype. `cpu_offload`: the shards, their gradients and optimizer states live in host
    memory. `prefetch_blocks`: blocks gathered ahead of the running one."""

    reshard_after_forward: bool
    gathers_bf16: bool
    cpu_offload: bool
    prefetch_blocks: int = FSDP2_IMPLICIT_PREFETCH_BLOCKS

    @classmethod
    def for_layout(cls, layout, precision: str) -> "FsdpSettings":
        """The settings for a Layout whose data_parallel_kind is "fsdp", under `--precision`.
        ZeRO stages below 2 there (data parallel next to --tp or --pp) run as ZeRO-2."""
        return cls(reshard_after_forward=layout.zero >= 3, gathers_bf16=precision == "bf16",
                   cpu_offload=layout.cpu_offload)
