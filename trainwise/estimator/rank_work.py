"""RankWork: what one rank of a layout computes and holds, as the layout time model needs
it (trainwise/estimator/layout_time.py), and the dtypes the engine communicates in."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.plan.fsdp_settings import FsdpSettings
from trainwise.techniques.precision import precision_policy
from trainwise.trace.depth import checkpoint_every


@dataclass(frozen=True)
class RankWork:
    """One rank's work, without any communication.

    forward_s, backward_s: seconds of ONE pipeline chunk (the whole micro-batch without
    --pp) through all of the rank's blocks and parts; backward includes the recomputation
    of checkpointed blocks. optimizer_s: one optimizer step over the rank's parameters as
    held after the tensor/pipeline split and before any data-parallel sharding (the model
    divides it by the shards). params, trainable_params: held by the rank after the
    tensor/pipeline split, before sharding; params_in_blocks: those of them in the
    transformer blocks (FSDP2 gathers one unit per block, the rest as one root unit).
    weight_bytes: bytes per parameter as stored (fp32 under bf16 mixed precision);
    gather_bytes: per parameter as FSDP2 all-gathers it (its compute dtype); reduce_bytes:
    per gradient element as reduced (DDP: the gradient's dtype; FSDP2: its reduce dtype).
    activation_bytes: one tensor-parallel activation collective, which is also one pipeline
    message: chunk rows x sequence x hidden x the activations' dtype bytes.
    grad_accum: micro-batches per optimizer step; chunks: pipeline chunks per micro-batch.
    root_gather_bytes, block_gather_bytes: bytes of one all-gather of the root unit and of
    one block as FSDP2 produces them (float8 weights at one byte; None: the elements x
    gather_bytes); amax_reductions_root, amax_reductions_per_block: the tiny all-reduces
    torchao runs before such a gather, one per float8 weight (its scale).
    compute_breakdown: optional seconds per category (the time model's names) of one
    chunk's forward and backward; passed through, scaled to the step."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    params: int
    trainable_params: int
    params_in_blocks: int
    blocks: int
    weight_bytes: int
    gather_bytes: int
    reduce_bytes: int
    activation_bytes: int
    grad_accum: int = 1
    chunks: int = 1
    recomputed_blocks: int = 0  # blocks whose forward checkpointing runs again in backward
    has_embedding: bool = True
    has_head: bool = True
    compute_breakdown: dict[str, float] = field(default_factory=dict)
    root_gather_bytes: int | None = None
    block_gather_bytes: int | None = None
    amax_reductions_root: int = 0
    amax_reductions_per_block: int = 0

    @property
    def chunk_compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def root_unit_gather_bytes(self) -> int:
        if self.root_gather_bytes is not None:
            return self.root_gather_bytes
        return (self.params - self.params_in_blocks) * self.gather_bytes

    @property
    def one_block_gather_bytes(self) -> float:
        if self.block_gather_bytes is not None:
            return self.block_gather_bytes
        return self.params_in_blocks / max(self.blocks, 1) * self.gather_bytes


def communicated_bytes(precision: str, device_type: str, data_parallel_kind: str) -> dict[str, int]:
    """{"weight_bytes", "gather_bytes", "reduce_bytes", "activation_bytes"} per element, as
    the engine holds and sends them: weights in the policy's dtype; FSDP2 under bf16 mixed
    precision gathers bf16 and reduces fp32 (plan/fsdp_settings.py, engine/parallel/fsdp.py),
    otherwise both in the weights' dtype; DDP reduces the gradients in their own dtype (the
    weights'); activations travel in the autocast dtype when there is one."""
    policy = precision_policy(precision, device_type)
    weight = policy.param_dtype.itemsize
    gather = reduce = weight
    if data_parallel_kind == "fsdp" and precision == "bf16":  # FsdpSettings.gathers_bf16
        gather, reduce = 2, 4
    activation = (policy.autocast_dtype or policy.param_dtype).itemsize
    return {"weight_bytes": weight, "gather_bytes": gather, "reduce_bytes": reduce, "activation_bytes": activation}


def recomputed_blocks(plan, block_ranges) -> int:
    """How many blocks of `block_ranges` ([first, end) in the whole stack) checkpointing
    runs forward again in backward: none without --grad-ckpt, blocks 0, k, 2k, ... with
    --grad-ckpt-every k (every block at k = 1), as techniques/checkpointing.py picks them."""
    if not plan.grad_ckpt:
        return 0
    every = checkpoint_every(plan)
    return sum(1 for first, end in block_ranges for index in range(first, end) if index % every == 0)


def reshards_after_forward(layout, precision: str) -> bool:
    """ZeRO-3 (FSDP2 frees a block's gathered parameters after its forward)."""
    return FsdpSettings.for_layout(layout, precision).reshard_after_forward


def rank_work(plan, layout, view, params, hidden_size: int, device_type: str, forward_s: float, backward_s: float,
              optimizer_s: float, compute_breakdown: dict[str, float] | None = None) -> RankWork:
    """The RankWork of pipeline rank `view` (estimator/rank_view.py) from what the per-rank
    estimate has: its parameters (estimator/rank_states.py's rank_parameters, at the
    tensor-parallel shapes, before sharding), the model's hidden size, and the time model's
    seconds of one chunk's forward and backward and of one unsharded optimizer step."""
    held = sum(p.copies * _elements(p.shape) for p in params)
    dtypes = communicated_bytes(plan.precision, device_type, layout.data_parallel_kind)
    activation = layout.chunk_batch * plan.seq_len * hidden_size * dtypes.pop("activation_bytes")
    gathered = lambda p: _elements(p.shape) * (p.gathered_itemsize or dtypes["gather_bytes"])  # noqa: E731
    block_params = [p for p in params if p.in_block]  # each stands for one per block
    return RankWork(forward_s=forward_s, backward_s=backward_s, optimizer_s=optimizer_s, params=held,
                    trainable_params=sum(p.copies * _elements(p.shape) for p in params if p.trainable),
                    params_in_blocks=sum(p.copies * _elements(p.shape) for p in params if p.in_block),
                    blocks=view.blocks, activation_bytes=activation, grad_accum=plan.grad_accum,
                    chunks=layout.microbatches,
                    recomputed_blocks=recomputed_blocks(plan, view.block_ranges or ((0, view.blocks),)),
                    has_embedding=view.has_embedding,
                    has_head=view.has_head, compute_breakdown=dict(compute_breakdown or {}),
                    root_gather_bytes=sum(gathered(p) for p in params if not p.in_block),
                    block_gather_bytes=sum(gathered(p) for p in block_params),
                    amax_reductions_root=sum(1 for p in params if not p.in_block and p.gathered_itemsize == 1),
                    amax_reductions_per_block=sum(1 for p in block_params if p.gathered_itemsize == 1), **dtypes)


def _elements(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
