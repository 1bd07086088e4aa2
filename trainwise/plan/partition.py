"""How a layout cuts a model, as arithmetic: which blocks each pipeline stage holds, how
many chunks a stage keeps in flight, what ZeRO-1 gives each rank, the per-part shape of a
fused projection, and whether sizes and batches divide as the layout needs.

Pure arithmetic on configs and shapes, no torch.distributed and no model family: which
modules a family splits is in trainwise/models/families/. The engine and the per-rank
estimate both read these, so the two cannot drift apart."""

from __future__ import annotations

from trainwise.common.errors import InputError


def check_tensor_parallel_sizes(config, tp: int) -> None:
    """InputError("--tp") when the model's heads or MLP width cannot be split `tp` ways
    (the family's part of the check is models/families/checks.py)."""
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


def intermediate_size(config) -> int:
    """The MLP's hidden width (GPT-2 calls it n_inner, None meaning 4 x hidden)."""
    return getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size


def stages_per_rank(schedule: str) -> int:
    """Interleaved 1F1B gives each rank two (virtual) stages; the others one."""
    return 2 if schedule == "interleaved-1f1b" else 1


def check_pipeline(config, pp: int, schedule: str, microbatches: int, batch_size: int) -> None:
    """InputError naming the flag when the model's blocks or the batch cannot be pipelined
    so (whether the family can be is models/families/checks.py's pipeline_family)."""
    if pp == 1:
        return
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


def check_layout_combination(plan, layout) -> None:
    """Knob combinations no layout of this kind can run, said before anything is built."""
    if plan.lora and (layout.tp > 1 or layout.pp > 1):
        raise InputError("--lora-rank", "LoRA runs with data parallel and sharded data parallel (--dp, --fsdp, "
                                        "--zero); not with --tp or --pp")
    if plan.compile and plan.compile_scope == "model" and layout.tp > 1:
        # Per block works (engine/compile_regions.py); the whole-model graph does not, on any device.
        raise InputError("--compile-scope", "model with --tp fails in PyTorch's compiled backward: the whole-model "
                                            "graph returns the vocab-parallel logits (a DTensor) beside the loss, and "
                                            "the loss's backward gives them a plain-tensor gradient (PyTorch issue "
                                            "172556); use --compile-scope blocks (the default)")
    if plan.precision == "fp16" and layout.zero >= 2:
        raise InputError("--precision", "fp16 loss scaling is not wired to sharded gradients yet; use bf16 with "
                                        "--zero 2/3")
    layout.data_parallel_kind  # noqa: B018 - raises the ZeRO-1 refusal
