"""How a layout cuts a model: which weights tensor parallel splits and along which
dimension, which blocks each pipeline stage holds, what ZeRO-1 gives each rank.

Pure facts about configs and shapes, no torch.distributed: the engine applies them with
DTensor, pipelining and FSDP, and the per-rank estimate reads the same facts to size each
rank's share, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.plan.errors import InputError

# Per family: (blocks path, {module path inside a block: "colwise" | "rowwise"}).
# Column-wise splits a Linear's output features (weight dim 0 and its bias), row-wise its
# input features (weight dim 1; the bias stays whole).
TP_BLOCK_PLANS = {
    "llama": ("model.layers", {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
                               "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
                               "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}),
    "bert": ("encoder.layer", {"attention.self.query": "colwise", "attention.self.key": "colwise",
                               "attention.self.value": "colwise", "attention.output.dense": "rowwise",
                               "intermediate.dense": "colwise", "output.dense": "rowwise"}),
    # GPT-2's projections are Conv1D (weight [in, out]); c_attn holds q, k and v side by side.
    "gpt2": ("h", {"attn.c_attn": "colwise", "attn.c_proj": "rowwise", "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}),
}
TP_FAMILY_OF = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "bert": "bert", "roberta": "bert",
                "gpt2": "gpt2"}
# Per model type: {module path inside a block: how many equal projections its output
# concatenates}. Tensor parallel splits each of them, and checkpoints store such a weight
# as [in, parts, out / parts] so that every layout's shards are plain slices of it.
FUSED_PROJECTIONS = {"gpt2": {"attn.c_attn": 3}}
# Attributes of a block's modules that hold a size tensor parallel divides (the heads a
# rank computes): GPT-2 splits c_attn's output by split_size.
TP_LOCAL_SIZES = {"gpt2": ("attn.split_size", "attn.num_heads")}
PIPELINE_FAMILY_OF = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2"}


@dataclass(frozen=True)
class PipelineParts:
    """Where a decoder family keeps its blocks, and the modules its first stage holds
    besides blocks (the embeddings) and its last stage (final norm, head); the first of
    `first` is the token embedding and the last of `last` the head (tied or not)."""

    blocks: str
    first: tuple[str, ...]
    last: tuple[str, ...]

    def holds(self, module: str, paths: tuple[str, ...]) -> bool:
        """Whether module name `module` is one of `paths` or inside one."""
        return any(module == path or module.startswith(path + ".") for path in paths)


PIPELINE_PARTS = {
    "llama": PipelineParts("model.layers", ("model.embed_tokens",), ("model.norm", "lm_head")),
    "gpt2": PipelineParts("transformer.h", ("transformer.wte", "transformer.wpe", "transformer.drop"),
                          ("transformer.ln_f", "lm_head")),
}


def check_tensor_parallel(config, tp: int, sequence_parallel: bool = False) -> None:
    """InputError("--tp" or "--sequence-parallel") when this architecture or its sizes
    cannot be split `tp` ways (and, with sequence parallel, over the sequence)."""
    if tp == 1:
        return
    model_type = getattr(config, "model_type", "?")
    if sequence_parallel and TP_FAMILY_OF.get(model_type) != "llama":
        raise InputError("--sequence-parallel", f"is implemented for the llama, mistral and qwen2 decoders; not "
                                                f"{model_type}")
    if model_type not in TP_FAMILY_OF:
        supported = ", ".join(sorted(TP_FAMILY_OF))
        raise InputError("--tp", f"tensor parallel supports {supported}; not {model_type}")
    sizes = {"attention heads": config.num_attention_heads,
             "key/value heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
             "intermediate size": intermediate_size(config)}
    for what, size in sizes.items():
        if size % tp:
            raise InputError("--tp", f"must divide the model's {what} ({size}); got {tp}")


def per_part_shape(shape: tuple[int, ...], parts: int, kind: str) -> tuple[int, ...]:
    """The shape of a fused projection's weight ([in, out]) or bias ([out]) held per part:
    [in, parts, out / parts] or [parts, out / parts]. Tensor parallel splits the last
    dimension, so each rank holds the same slice of every part."""
    if kind == "weight":
        return (shape[0], parts, shape[1] // parts)
    return (parts, shape[0] // parts)


def blocks_owner(model, blocks_path: str):
    """The module of `model` that owns `blocks_path` (heads wrap the core model under
    various names), or None."""
    for _, module in model.named_modules():
        try:
            module.get_submodule(blocks_path)
            return module
        except AttributeError:
            continue
    return None


def replace_submodule(root, path: str, module) -> None:
    """Put `module` at `path` (dotted) under `root`, in place of what is there."""
    owner, _, name = path.rpartition(".")
    setattr(root.get_submodule(owner) if owner else root, name, module)


def divide_local_sizes(block, family: str, tp: int) -> None:
    """Divide by tp the size attributes a block of `family` keeps for the heads a rank
    computes (TP_LOCAL_SIZES), in place."""
    for path in TP_LOCAL_SIZES.get(family, ()):
        owner, _, name = path.rpartition(".")
        module = block.get_submodule(owner)
        setattr(module, name, getattr(module, name) // tp)


def intermediate_size(config) -> int:
    """The MLP's hidden width (GPT-2 calls it n_inner, None meaning 4 x hidden)."""
    return getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size


def stages_per_rank(schedule: str) -> int:
    """Interleaved 1F1B gives each rank two (virtual) stages; the others one."""
    return 2 if schedule == "interleaved-1f1b" else 1


def check_pipeline(config, pp: int, schedule: str, microbatches: int, batch_size: int) -> None:
    """InputError naming the flag when the model or the batch cannot be pipelined so."""
    if pp == 1:
        return
    if getattr(config, "model_type", None) not in PIPELINE_FAMILY_OF:
        raise InputError("--pp", f"pipeline parallel supports the {', '.join(PIPELINE_FAMILY_OF)} decoders; "
                                 f"not {getattr(config, 'model_type', '?')}")
    stages = pp * stages_per_rank(schedule)
    if config.num_hidden_layers < stages:
        raise InputError("--pp", f"{stages} stages need at least {stages} blocks; the model has "
                                 f"{config.num_hidden_layers}")
    if batch_size % microbatches:
        raise InputError("--microbatches", f"must divide the micro-batch size {batch_size} (got {microbatches})")
    if schedule == "1f1b" and microbatches < pp:
        raise InputError("--microbatches", f"1F1B needs at least as many micro-batches as stages ({pp}); "
                                           f"got {microbatches}")
    if schedule == "interleaved-1f1b" and microbatches % pp:
        raise InputError("--microbatches", f"interleaved 1F1B needs a multiple of --pp {pp} (got {microbatches})")


def pipeline_microbatches(plan, pp: int) -> int:
    """The pipeline chunks one micro-batch is split into (--microbatches, default 2 x pp)."""
    return plan.microbatches or 2 * pp


def balanced_bounds(blocks: int, stages: int) -> list[tuple[int, int]]:
    """[first, end) blocks of each stage: contiguous, sizes differing by at most one (the
    extra blocks go to the middle stages; the first and last also carry embedding/head)."""
    base, extra = divmod(blocks, stages)
    sizes = [base] * stages
    order = sorted(range(stages), key=lambda s: (s in (0, stages - 1), s))
    for s in order[:extra]:
        sizes[s] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def rank_stages(rank: int, pp: int, schedule: str) -> list[int]:
    """The stage indices pipeline rank `rank` runs (stage s on rank s mod pp)."""
    return [rank + k * pp for k in range(stages_per_rank(schedule))]


def stage_chunks_in_flight(schedule: str, rank: int, pp: int, microbatches: int) -> int:
    """Pipeline chunks whose activations one stage of pipeline rank `rank` holds at once at
    most: GPipe runs every forward before any backward; 1F1B starts backward after
    pp - rank warm-up forwards; interleaved 1F1B (two stages per rank) warms up
    pp + 2 (pp - 1 - rank) chunk-stages, spread over its two stages."""
    if schedule == "gpipe":
        return microbatches
    if schedule == "1f1b":
        return min(microbatches, pp - rank)
    warmup = min(microbatches * 2, pp + 2 * (pp - 1 - rank) + 1)
    return -(-warmup // 2)


def zero_one_owner(sizes_by_group: list[list[int]], ranks: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer's partition: within each parameter group, largest first, each
    parameter goes to the rank holding the fewest elements so far (lowest rank on ties).
    Returns the owning rank of every parameter, in the groups' order."""
    totals = [0] * ranks
    owners = []
    for sizes in sizes_by_group:
        group_owners = [0] * len(sizes)
        for index in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
            rank = min(range(ranks), key=lambda r: totals[r])
            group_owners[index] = rank
            totals[rank] += sizes[index]
        owners.append(group_owners)
    return owners


def check_model_layout(config, plan, layout) -> None:
    """Every layout check for `plan` on `layout` (the knobs' combination, then the model's
    shapes): an InputError naming the flag, before any process starts or any estimate is
    traced."""
    check_layout_combination(plan, layout)
    check_tensor_parallel(config, layout.tp, layout.sequence_parallel)
    check_pipeline(config, layout.pp, plan.pp_schedule, pipeline_microbatches(plan, layout.pp), plan.batch_size)


@dataclass
class DataParallelChoice:
    """How data parallelism is done for a layout: "none", "ddp", "zero1" or "fsdp"."""

    kind: str


def data_parallel_choice(layout) -> DataParallelChoice:
    """The layout's own decision (Layout.data_parallel_kind, which raises the ZeRO-1 refusal)."""
    return DataParallelChoice(layout.data_parallel_kind)


def check_layout_combination(plan, layout) -> None:
    """Knob combinations no layout of this kind can run, said before anything is built."""
    if plan.lora and (layout.tp > 1 or layout.pp > 1):
        raise InputError("--lora-rank", "LoRA runs with data parallel and sharded data parallel (--dp, --fsdp, "
                                        "--zero); not with --tp or --pp")
    if plan.precision == "fp16" and layout.zero >= 2:
        raise InputError("--precision", "fp16 loss scaling is not wired to sharded gradients yet; use bf16 with "
                                        "--zero 2/3")
    layout.data_parallel_kind  # noqa: B018 - raises the ZeRO-1 refusal
