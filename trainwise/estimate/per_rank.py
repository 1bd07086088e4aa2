"""One rank's memory under a parallel layout (DDP, ZeRO-1/2/3, CPU offload, TP, PP).

Two parts, each from what really runs:

* **The rank's model states** (weights, gradients, optimizer states) are sized exactly:
  the model is built on the meta device at the rank's shapes (tensor parallel divides the
  heads, key/value heads, MLP width and vocabulary, as the engine's DTensor plan splits
  them; a pipeline rank holds its stage's blocks, the embeddings on the first stage, the
  final norm and head on the last, and a head tied to the embedding on both), then sharded
  as FSDP2 shards (dimension 0, rank 0 holding the rounded-up share) or
  ZeroRedundancyOptimizer partitions (whole parameters, largest first, to the least loaded
  rank). The optimizer's states are created on fake tensors of those shapes by the real
  optimizer, so Adafactor's factored and 8-bit Adam's quantised states come out as they
  would.
* **Activations and temporaries** come from the traced one-device step of the rank's
  workload: the same tensor-parallel shapes, the stage's blocks, the pipeline chunk
  (micro-batch / --microbatches) as batch; a pipeline stage holds the activations of as
  many chunks as its schedule keeps in flight (trainwise/plan/partition.py). Under
  tensor parallel the head's rank adds the one tensor the vocab-parallel loss keeps
  beyond the plain cross-entropy (measured; see _loss_parallel_extra).

Communication buffers are added by rule and named as such (_Communication): FSDP2's
all-gathered blocks in the compute dtype, which depend on where in the step the peak
falls, its reduce-scatter input, and the pipeline's receive buffers. DDP's gradient
buckets are the gradients themselves (gradient_as_bucket_view) but live for the whole
run, so they are counted at the peak. Tensor parallel's collectives add nothing that
persists; its vocab-parallel loss adds one tensor (above).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainwise.trace.depth import block_count, with_blocks
from trainwise.estimate.memory import MemoryEstimate
from trainwise.plan.layout import Layout
from trainwise.plan.partition import (FUSED_PROJECTIONS, PIPELINE_FAMILY_OF, PIPELINE_PARTS, TP_BLOCK_PLANS,
                                      TP_FAMILY_OF, balanced_bounds, blocks_owner, data_parallel_choice,
                                      divide_local_sizes, per_part_shape, pipeline_microbatches, rank_stages,
                                      replace_submodule, stage_chunks_in_flight, stages_per_rank, zero_one_owner)
from trainwise.plan.plan import Plan
from trainwise.step.precision import precision_policy

STATE_KEYS = ("weights", "gradients", "optimizer")


@dataclass(frozen=True)
class RankView:
    """What one pipeline rank holds: `blocks` of the model's blocks (its stages' together),
    the embedding and/or the head, and how many chunks' activations it keeps at once."""

    pipeline_rank: int
    stages: tuple[int, ...]
    blocks: int
    block_range: tuple[int, int]  # [first, end) of its first stage, for the report
    has_embedding: bool
    has_head: bool
    chunks_in_flight: int

    def to_json(self) -> dict:
        return {"pipeline_rank": self.pipeline_rank, "stages": list(self.stages), "blocks": self.blocks,
                "first_stage_blocks": list(self.block_range), "embedding": self.has_embedding,
                "head": self.has_head, "chunks_in_flight": self.chunks_in_flight}


def rank_views(config, plan: Plan, layout: Layout) -> list[RankView]:
    """One view per pipeline rank (a single view holding everything without --pp)."""
    blocks = block_count(config) or 0
    if layout.pp == 1:
        return [RankView(0, (0,), blocks, (0, blocks), True, True, 1)]
    total = layout.pp * stages_per_rank(plan.pp_schedule)
    bounds = balanced_bounds(blocks, total)
    microbatches = pipeline_microbatches(plan, layout.pp)
    views = []
    for rank in range(layout.pp):
        stages = rank_stages(rank, layout.pp, plan.pp_schedule)
        views.append(RankView(rank, tuple(stages), sum(bounds[s][1] - bounds[s][0] for s in stages),
                              bounds[stages[0]], 0 in stages, total - 1 in stages,
                              stage_chunks_in_flight(plan.pp_schedule, rank, layout.pp, microbatches)))
    return views


def rank_config(config, layout: Layout, blocks: int):
    """The config whose one-device model has this rank's shapes (with rank_reshape's
    changes): tensor parallel divides the vocabulary and, in the Llama family, whose head
    size is a config entry, the heads, key/value heads and MLP width; `blocks` blocks."""
    if config is None:
        return None
    local = with_blocks(config, blocks) if layout.pp > 1 else copy.deepcopy(config)
    if layout.tp > 1:
        local.vocab_size = -(-config.vocab_size // layout.tp)  # rank 0's rows: DTensor gives it the larger share
    if layout.tp > 1 and TP_FAMILY_OF.get(config.model_type) == "llama":
        local.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        local.num_attention_heads = config.num_attention_heads // layout.tp
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        local.num_key_value_heads = kv_heads // layout.tp
        local.intermediate_size = config.intermediate_size // layout.tp
    return local


def rank_reshape(config, layout: Layout) -> Callable[[nn.Module], None] | None:
    """What turns a model built from rank_config into this rank's tensor-parallel shapes
    where a config cannot say them (BERT and GPT-2 derive the head size from the hidden
    size and the head count): every projection the engine splits is rebuilt on the meta
    device at its local size, as engine/parallel/tensor_parallel.py cuts it (column-wise:
    output features / tp; row-wise: input features / tp). None where rank_config does it all."""
    family = TP_FAMILY_OF.get(getattr(config, "model_type", None))
    if layout.tp == 1 or family in (None, "llama"):
        return None
    return lambda model: tensor_parallel_shapes(model, family, layout.tp)


HEADLESS_VOCABULARY = 8


def headless_workload(config, reshape: Callable[[nn.Module], None] | None):
    """(config, reshape) of the traced workload of a pipeline stage without the head: the
    head and the loss shrunk to 8 outputs, so that the logits, their gradient and the
    loss's temporaries (which a one-device trace of the rank's blocks would peak on) are
    not counted on a stage that never computes them; the embedding keeps its rows."""
    small = copy.deepcopy(config)
    small.vocab_size = HEADLESS_VOCABULARY

    def reshape_headless(model: nn.Module) -> None:
        if reshape is not None:
            reshape(model)
        old = model.get_input_embeddings()
        model.set_input_embeddings(nn.Embedding(config.vocab_size, old.embedding_dim, padding_idx=old.padding_idx,
                                                device="meta", dtype=old.weight.dtype))
    return small, reshape_headless


def tensor_parallel_shapes(model: nn.Module, family: str, tp: int) -> None:
    """Rebuild `model`'s split projections at one rank's shapes, in place (meta tensors)."""
    blocks_path, plan = TP_BLOCK_PLANS[family]
    base = getattr(model, "get_base_model", lambda: model)()
    for block in blocks_owner(base, blocks_path).get_submodule(blocks_path):
        for path, kind in plan.items():
            replace_submodule(block, path, _local_projection(block.get_submodule(path), kind, tp))
        divide_local_sizes(block, family, tp)


def _local_projection(module: nn.Module, kind: str, tp: int) -> nn.Module:
    """A Linear or a Conv1D (weight [in, out]) like `module`, its output (column-wise) or
    input (row-wise) features divided by tp."""
    weight = module.weight
    conv1d = type(module).__name__ == "Conv1D"
    in_features, out_features = weight.shape if conv1d else weight.shape[::-1]
    if kind == "colwise":
        out_features //= tp
    else:
        in_features //= tp
    with torch.device("meta"):
        local = type(module)(out_features, in_features) if conv1d else nn.Linear(
            in_features, out_features, bias=module.bias is not None)
    local.to(weight.dtype)
    for param, old in zip(local.parameters(), module.parameters()):
        param.requires_grad_(old.requires_grad)
    return local


def rank_plan(plan: Plan, layout: Layout) -> Plan:
    """The one-device plan whose traced step is one pipeline chunk of this rank's work."""
    batch = plan.batch_size // pipeline_microbatches(plan, layout.pp) if layout.pp > 1 else plan.batch_size
    precision = plan.precision
    if precision == "bf16" and data_parallel_choice(layout).kind == "fsdp":
        # FSDP2's bf16 policy computes on gathered bf16 copies (counted as communication
        # buffers), not on autocast's cached casts of fp32 weights: trace bf16 weights.
        precision = "bf16-pure"
    return plan.replace(batch_size=batch, precision=precision, nproc=1, dp=1, fsdp=1, tp=1, pp=1, zero=None,
                        cpu_offload=False, microbatches=None, sequence_parallel=False)


@dataclass(frozen=True)
class _Param:
    name: str
    shape: tuple[int, ...]  # after tensor parallel
    dtype: torch.dtype
    trainable: bool
    copies: int  # blocks holding one like it
    in_block: bool


@dataclass(frozen=True)
class RankModel:
    """The rank's model: its config (rank_config) and `build(blocks)`, which builds it on
    the meta device with that many blocks (None: as configured)."""

    config: object
    build: Callable[[int | None], nn.Module]
    task: str | None

    @property
    def single_stack(self) -> bool:
        return self.config is not None and not getattr(self.config, "is_encoder_decoder", False)


def rank_memory(single: MemoryEstimate, activations_by_module: dict[str, int], model: RankModel, plan: Plan,
                layout: Layout, view: RankView, device_type: str) -> tuple[MemoryEstimate, dict]:
    """Rank 0 of pipeline rank `view`: (its MemoryEstimate, details for the report).

    `single` is the traced one-device estimate of the rank's workload (rank_config,
    rank_plan), `activations_by_module` its saved activations per module."""
    policy = precision_policy(plan.precision, device_type)
    params = _rank_parameters(model, plan, policy, view, layout.tp)
    choice = data_parallel_choice(layout).kind
    shards = layout.fsdp if choice == "fsdp" else 1
    state = _state_bytes(params, plan, device_type, shards, layout.fsdp if choice == "zero1" else 1)
    host = 0
    if layout.cpu_offload:
        host = sum(state.values())
        state = dict.fromkeys(STATE_KEYS, 0)
    communication = _Communication(params, plan, policy, layout, view, choice,
                                   getattr(model.config, "hidden_size", 0))
    traced_policy = precision_policy(rank_plan(plan, layout).precision, device_type)  # what `single` ran
    activations = (_stage_activations(single.activations, activations_by_module, view, model.config)
                   - _sequence_parallel_saving(activations_by_module, model, plan, layout, traced_policy)
                   + _loss_parallel_extra(model, plan, layout, view) * view.chunks_in_flight)
    ratios = {key: (state[key] / getattr(single, key)) if getattr(single, key) else 0.0 for key in STATE_KEYS}
    ratios["activations"] = activations / single.activations if single.activations else 0.0
    gradients_at = _rank_gradients(choice, plan, state["gradients"], ratios["gradients"], shards)
    candidates = [_phase_peak(single, phase, live, ratios, gradients_at, communication)
                  for phase, live in (single.phase_at_peak or {single.peak_phase: single.at_peak}).items()]
    candidates.append(_embedding_backward_peak(model, layout, view, state, activations, traced_policy))
    phase, peak_allocated, at_peak = max(candidates, key=lambda candidate: candidate[1])
    slack = single.peak_reserved - single.peak_allocated  # what the allocator model kept on top
    peak_reserved = peak_allocated + max(slack, 0)
    memory = dataclasses.replace(
        single, weights=state["weights"], gradients=state["gradients"], optimizer=state["optimizer"],
        activations=activations, peak_allocated=peak_allocated, peak_reserved=peak_reserved,
        device_total=peak_reserved + single.context, peak_phase=phase, at_peak=at_peak, phase_peaks={},
        phase_at_peak={}, communication=at_peak.get("communication", 0), host=host)
    details = {**view.to_json(), "parameters": sum(p.copies * math.prod(_shard_shape(p.shape, shards)) for p in params),
               "communication_buffers": communication.at(phase, at_peak)}
    return memory, details


def _embedding_backward_peak(model: RankModel, layout: Layout, view: RankView, state: dict,
                             activations: int, traced_policy) -> tuple[str, int, dict]:
    """The end of a chunk's backward on the rank holding the vocab-parallel embedding.
    DTensor's embedding backward makes the weight's gradient whole (vocabulary x hidden)
    before the hook in engine/parallel/tensor_parallel.py cuts the rank's slice out of it:
    for that moment the whole gradient and the slice are both alive, next to every
    gradient of the rank, the weights, the optimizer states and the activations of the
    chunks still in flight. The one-device trace of the rank's shapes never makes the whole
    gradient; on a pipeline's first stage, which holds no logits, this moment is the peak
    (tiny-llama TP 2 x PP 2 read 21 % low without it)."""
    config = model.config  # the rank's: its vocabulary is the tp-th part
    if layout.tp == 1 or not view.has_embedding:
        return "backward", 0, {}
    # Rank 0's rows times tp: up to tp - 1 rows over the whole vocabulary when it is uneven.
    whole = config.vocab_size * layout.tp * config.hidden_size * traced_policy.param_dtype.itemsize
    held = round(activations * (view.chunks_in_flight - 1) / view.chunks_in_flight)
    live = {**{key: state[key] for key in STATE_KEYS}, "activations": held, "temporary": whole}
    return "backward", sum(live.values()), live


def _rank_gradients(choice: str, plan: Plan, gradients: int, ratio: float, shards: int):
    """`at(phase, live)`: the rank's gradient bytes alive at a traced point. DDP's buckets
    (ZeRO-1 runs on DDP) hold them from the first backward on, past zero_grad. FSDP2 skips
    the reduce-scatter until the last micro-batch (engine/accumulation.py), so with
    accumulation the gradients alive in forward and backward are unsharded. Otherwise
    the traced gradients at the rank's share."""
    def at(phase: str, live: dict[str, int]) -> int:
        if choice in ("ddp", "zero1"):
            return gradients
        unsharded = choice == "fsdp" and plan.grad_accum > 1 and phase in ("forward", "backward")
        return round(live.get("gradients", 0) * ratio * (shards if unsharded else 1))
    return at


def _phase_peak(single: MemoryEstimate, phase: str, live: dict[str, int], ratios: dict[str, float],
                gradients_at: Callable[[str, dict], int], communication: "_Communication") -> tuple[str, int, dict]:
    """(phase, the rank's peak in it, live bytes per category there): the traced phase's
    composition with model states and activations scaled to the rank's share, plus the
    communication buffers alive at that point. The optimizer step's temporaries scale with
    the states it updates (a sharded optimizer works on shards)."""
    rank_live = dict(live)
    for key, ratio in ratios.items():
        rank_live[key] = round(live.get(key, 0) * ratio)
    rank_live["gradients"] = gradients_at(phase, live)
    if phase in ("optimizer", "zero_grad"):
        rank_live["temporary"] = round(live.get("temporary", 0) * ratios["optimizer"])
    buffers = sum(communication.at(phase, live).values())
    if buffers:
        rank_live["communication"] = buffers
    base = single.phase_peaks.get(phase) or sum(live.values())  # the allocator's rounding stays
    return phase, max(base - sum(live.values()), 0) + sum(rank_live.values()), rank_live


def _rank_parameters(rank_model: RankModel, plan: Plan, policy, view: RankView, tp: int = 1) -> list[_Param]:
    """The rank's parameters at their tensor-parallel shapes, built from a one-block model
    (blocks are identical; each block parameter stands for `view.blocks` copies) where the
    model is one stack of blocks, else from the whole model."""
    from trainwise.step.checkpointing import largest_module_list
    from trainwise.step.recipe import prepare_model

    one_block = view.blocks > 0 and rank_model.single_stack
    model = prepare_model(rank_model.build(1 if one_block else None), plan, policy, rank_model.task)
    base = getattr(model, "get_base_model", lambda: model)()
    blocks = largest_module_list(base) if one_block else None
    in_block = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    held_by = {}  # parameter id -> the pipeline ends ("first", "last") holding it; both for a tied head
    if not (view.has_embedding and view.has_head):  # a pipeline stage
        parts = PIPELINE_PARTS[PIPELINE_FAMILY_OF[rank_model.config.model_type]]
        for end, paths in (("first", parts.first), ("last", parts.last)):
            for path in paths:
                for p in base.get_submodule(path).parameters():
                    held_by.setdefault(id(p), set()).add(end)
    fused = FUSED_PROJECTIONS.get(getattr(rank_model.config, "model_type", None), {})
    params = []
    for name, param in model.named_parameters():
        ends = held_by.get(id(param))
        if ends and not (("first" in ends and view.has_embedding) or ("last" in ends and view.has_head)):
            continue
        block = id(param) in in_block
        params.append(_Param(name, _held_shape(name, tuple(param.shape), fused if tp > 1 else {}), param.dtype,
                             param.requires_grad, view.blocks if block else 1, block))
    return params


def _held_shape(name: str, shape: tuple[int, ...], fused: dict[str, int]) -> tuple[int, ...]:
    """The shape the engine holds a parameter in: tensor parallel keeps a fused
    projection per part (engine/parallel/conv1d_parallel.py), which FSDP2 then shards on
    its first dimension (a bias [3, n] splits by rows, not by elements)."""
    for path, parts in fused.items():
        for kind, whole_dims in (("weight", 2), ("bias", 1)):
            if name.endswith(f".{path}.{kind}") and len(shape) == whole_dims:
                return per_part_shape(shape, parts, kind)
    return shape


def _shard_shape(shape: tuple[int, ...], shards: int) -> tuple[int, ...]:
    """Rank 0's FSDP2 shard: dimension 0 split, rounded up (the last ranks hold the padding)."""
    if shards == 1 or not shape:
        return shape
    return (-(-shape[0] // shards), *shape[1:])


def _state_bytes(params: list[_Param], plan: Plan, device_type: str, shards: int, zero_one_ranks: int) -> dict:
    """Rank 0's weights, gradients and optimizer states in bytes: FSDP2 shards all three
    over `shards` ranks; ZeRO-1 gives rank 0 the optimizer states of its partition."""
    weights = gradients = 0
    for p in params:
        local = p.copies * math.prod(_shard_shape(p.shape, shards)) * p.dtype.itemsize
        weights += local
        gradients += local if p.trainable else 0
    per_param, groups = _optimizer_state_bytes(params, plan, device_type, shards)
    if zero_one_ranks > 1:
        sizes = [[math.prod(params[i].shape) for i in group for _ in range(params[i].copies)] for group in groups]
        owners = zero_one_owner(sizes, zero_one_ranks)
        optimizer = 0
        for group, group_owners in zip(groups, owners):
            expanded = [i for i in group for _ in range(params[i].copies)]
            optimizer += sum(per_param[i] for i, owner in zip(expanded, group_owners) if owner == 0)
    else:
        optimizer = sum(per_param[i] * params[i].copies for i in per_param)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer}


def _optimizer_state_bytes(params: list[_Param], plan: Plan, device_type: str, shards: int):
    """({parameter index: its optimizer-state bytes on the device}, parameter indices per
    optimizer group), from the real optimizer's state on fake tensors of the shard shapes."""
    from trainwise.trace.step_trace import create_optimizer_state, device_step_counter, traced_optimizer

    with FakeTensorMode():
        holder = nn.Module()
        fakes = {}
        for index, p in enumerate(params):
            # Names keep what decides weight decay (norm/bias markers, dimensions).
            fake = nn.Parameter(torch.empty(_shard_shape(p.shape, shards), dtype=p.dtype), requires_grad=p.trainable)
            holder.register_parameter(f"p{index}_" + p.name.replace(".", "_"), fake)
            fakes[id(fake)] = index
        optimizer = traced_optimizer(plan, holder, device_type)
        create_optimizer_state(holder, optimizer)
        per_param: dict[int, int] = {}
        groups = []
        for group in optimizer.param_groups:
            groups.append([fakes[id(p)] for p in group["params"]])
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                per_param[fakes[id(p)]] = sum(
                    t.nbytes for key, t in state.items()
                    if isinstance(t, torch.Tensor) and (key != "step" or device_step_counter(group, device_type)))
    return per_param, groups


class _Communication:
    """The rank's communication buffers on the device, in bytes by what they are for, at a
    point of the step (`at(phase, live)`).

    FSDP2 (engine/parallel/fsdp.py) gathers a block's parameters in the compute dtype (bf16
    under its bf16 policy, else the weights' dtype) and reduce-scatters its gradients (fp32
    under bf16). The root unit (embedding, final norm, head) stays gathered from forward to
    backward. ZeRO-2 keeps every block gathered from its forward to its backward; ZeRO-3
    holds the running block and the prefetched next one in forward, and in backward the
    running, the prefetched and the previous block's reduce-scatter input. A traced peak
    with no gradients yet is the very start of backward: only the last block has been
    gathered (prefetched) and nothing is being reduced (checked against gloo runs in
    tests/test_parallel_engine.py). Under gradient accumulation FSDP2 defers the
    reduce-scatter to the last micro-batch and holds unsharded gradients until then
    (counted in the gradients row at the peak, not here). Pipeline receive buffers (one per chunk and direction,
    in the residual stream's dtype) live for the whole run."""

    def __init__(self, params: list[_Param], plan: Plan, policy, layout: Layout, view: RankView, choice: str,
                 hidden_size: int):
        self.fsdp = choice == "fsdp"
        # With accumulation the traced gradients exist from the last micro-batch's start, so
        # they do not tell its start from later; without checkpointing the peak is at the
        # start (activations fall after it), with checkpointing assume later (more buffers).
        self.gradients_mark_progress = plan.grad_accum == 1 or plan.grad_ckpt
        self.zero = layout.zero
        self.blocks = view.blocks
        self.block = self.root = self.reduce_block = 0
        if self.fsdp:
            compute = torch.bfloat16 if policy.name == "bf16" else None

            def full(selected, dtype=None):
                return sum(math.prod(p.shape) * (dtype or p.dtype).itemsize for p in selected)
            self.block = full([p for p in params if p.in_block], compute)
            self.root = full([p for p in params if not p.in_block], compute)
            reduce = torch.float32 if compute is not None else None
            self.reduce_block = full([p for p in params if p.in_block and p.trainable], reduce)
        self.pipeline = 0
        if layout.pp > 1:
            total = layout.pp * stages_per_rank(plan.pp_schedule)
            directions = sum((s != 0) + (s != total - 1) for s in view.stages)
            microbatches = pipeline_microbatches(plan, layout.pp)
            chunk = plan.batch_size // microbatches * plan.seq_len * hidden_size * policy.param_dtype.itemsize
            self.pipeline = directions * microbatches * chunk

    def at(self, phase: str, live: dict[str, int]) -> dict[str, int]:
        buffers = {"pipeline receive buffers": self.pipeline}
        if self.fsdp and phase in ("forward", "backward"):
            backward_started = phase == "backward" and live.get("gradients", 0) > 0 and self.gradients_mark_progress
            if self.zero < 3:
                gathered = self.blocks
            elif phase == "forward" or backward_started:
                gathered = min(2, self.blocks)
            else:
                gathered = min(1, self.blocks)
            buffers["fsdp all-gathered parameters"] = self.root + gathered * self.block
            if backward_started:
                buffers["fsdp reduce-scatter gradients"] = self.reduce_block
        return {name: value for name, value in buffers.items() if value}


def _loss_parallel_extra(model: RankModel, plan: Plan, layout: Layout, view: RankView) -> int:
    """The vocab-parallel cross-entropy (DTensor's loss_parallel, on the rank holding the
    causal-LM head) keeps one more fp32 tensor of the local logits' size than the plain
    cross-entropy the one-device trace runs. Found by measuring rank 0 of tiny-llama on
    gloo against the local-shape model at two vocabularies; without it the estimate read
    11 % low there. tests/test_parallel_engine.py ("TP 2", "TP 2, vocabulary 4096")
    checks the peak with it."""
    if layout.tp == 1 or not view.has_head or model.task != "causal-lm" or model.config is None:
        return 0
    if TP_FAMILY_OF.get(getattr(model.config, "model_type", "")) not in ("llama", "gpt2"):  # vocab-parallel heads
        return 0
    chunk = plan.batch_size // pipeline_microbatches(plan, layout.pp) if layout.pp > 1 else plan.batch_size
    return chunk * plan.seq_len * model.config.vocab_size * 4  # model.config: already the rank's vocabulary


def _sequence_parallel_saving(by_module: dict[str, int], model: RankModel, plan: Plan, layout: Layout,
                              policy) -> int:
    """Saved activations sequence parallel divides by tp: what each block's norms saved and
    what the block saved outside its sub-modules (the residual sums the next norm keeps),
    and the final norm's, less each norm's output where it is saved whole all the same
    (without autocast the projections after it keep their gathered input; under autocast
    they keep their own low-precision casts, attributed to them, and the output itself is
    not saved). Measured from the traced blocks' middle one, times the blocks."""
    if not layout.sequence_parallel or model.config is None:
        return 0
    indices = sorted({int(m.split(".")[2]) for m in by_module if m.startswith("model.layers.")})
    if not indices:
        return 0
    block = f"model.layers.{indices[len(indices) // 2]}"
    whole = (plan.batch_size * plan.seq_len * model.config.hidden_size * policy.param_dtype.itemsize
             if policy.autocast_dtype is None else 0)
    per_block = sum(nbytes for module, nbytes in by_module.items()
                    if module == block or (module.startswith(block + ".") and module.endswith("layernorm"))) - 2 * whole
    final = by_module.get("model.norm", 0) - whole
    return max(round((per_block * model.config.num_hidden_layers + final) * (1 - 1 / layout.tp)), 0)


def _stage_activations(traced: int, by_module: dict[str, int], view: RankView, config) -> int:
    """Saved activations of the rank's stages: the traced chunk's, less what the embeddings
    or the head (final norm, logits, loss) saved where the rank holds none, times the
    chunks in flight."""
    if view.has_embedding and view.has_head:
        return traced * view.chunks_in_flight
    parts = PIPELINE_PARTS[PIPELINE_FAMILY_OF[config.model_type]]
    core = parts.blocks.split(".")[0] + "."

    def is_head(module: str) -> bool:  # the loss runs outside the core model
        return parts.holds(module, parts.last) or not (module.startswith(core) or module == "(model inputs)")

    dropped = sum(nbytes for module, nbytes in by_module.items()
                  if (not view.has_head and is_head(module))
                  or (not view.has_embedding and parts.holds(module, parts.first)))
    return max(traced - dropped, 0) * view.chunks_in_flight
