"""Packed documents: rows holding several documents, each attending only to itself
(`--packing documents`).

A packed row carries `position_ids` that restart at 0 where each document starts, and no
`attention_mask`. transformers (5.x) then finds the documents from the position ids
(masking_utils.find_packed_sequence_indices) and builds a block-diagonal causal mask for
sdpa and eager; flash attention reads the same position ids as variable-length
boundaries, but only for a one-row batch, so flash with more rows is refused. The label
of each document's first token is -100: the previous document's last token must not be
trained to predict it (transformers shifts labels across the whole row).

transformers reads the documents only when no KV cache is passed, and a model whose config
says use_cache=True (most causal LMs) makes one even in training, silently skipping the
document masks: `attend_within_documents` turns the cache off (a training step never
reads it)."""

from __future__ import annotations

import torch

from trainwise.common.errors import InputError

IGNORE_INDEX = -100  # label value the transformers losses skip
# Model families whose transformers code passes position_ids to create_causal_mask and
# to the attention kernel (read in transformers 5.23; each one checked with sdpa and eager
# by tests/test_document_packing.py). falcon, opt and bloom were tried and leak across
# documents (they do not read packed position ids), so they are refused.
DOCUMENT_MASK_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gpt_neox", "gpt2")
SYNTHETIC_DOCUMENTS_PER_ROW = 4  # synthetic rows are cut into about this many documents


def positions_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """Position ids (int64, the shape of `starts`) counting from 0 at every True of the
    bool tensor `starts` and at each row's first token."""
    index = torch.arange(starts.shape[-1], device=starts.device).expand(starts.shape)
    starts = starts.clone()
    starts[..., 0] = True
    last_start = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - last_start


def as_documents(input_ids: torch.Tensor, labels: torch.Tensor, starts: torch.Tensor) -> dict[str, torch.Tensor]:
    """A causal-LM micro-batch whose rows are documents beginning where `starts` is True:
    input_ids, position_ids restarting at each document, and `labels` with each
    document's first token set to -100. No attention_mask (its absence is what makes
    transformers read the documents from the position ids)."""
    positions = positions_from_starts(starts)
    return {"input_ids": input_ids, "position_ids": positions,
            "labels": labels.masked_fill(positions == 0, IGNORE_INDEX)}


def random_document_starts(shape: tuple[int, int], generator: torch.Generator | None) -> torch.Tensor:
    """Bool starts cutting rows of `shape` into documents of random length (about
    SYNTHETIC_DOCUMENTS_PER_ROW per row), for synthetic data and the estimate's trace."""
    share = min(1.0, SYNTHETIC_DOCUMENTS_PER_ROW / shape[-1])
    return torch.rand(shape, generator=generator) < share


def attend_within_documents(model: torch.nn.Module) -> None:
    """Turn off `model`'s KV cache (config.use_cache, and a nested text config's), so
    transformers builds document masks from the batch's position ids. Weights untouched."""
    config = getattr(model, "config", None)
    for part in (config, getattr(config, "text_config", None)):
        if part is not None and hasattr(part, "use_cache"):
            part.use_cache = False


def packable_auto_pick(plan, choice: str, note: str) -> tuple[str, str]:
    """`--attention auto`'s (choice, note), moved from flash to sdpa when the plan packs
    documents in rows of more than one (flash keeps documents apart only one row at a time)."""
    if choice != "flash" or getattr(plan, "packing", "stream") != "documents" or plan.batch_size == 1:
        return choice, note
    return "sdpa", note.replace("picked flash", "picked sdpa") + "; not flash: --packing documents with " \
                                                                  "--batch-size above 1"


def check_packing(plan, spec=None) -> None:
    """InputError naming --packing when `plan` packs documents and the model, the
    attention kernel or the layout would let attention cross them."""
    if getattr(plan, "packing", "stream") != "documents":
        return
    if plan.pp > 1:
        raise InputError("--packing", "documents with --pp > 1 is not supported yet (the pipeline stages build "
                                      "their own masks); use --packing stream")
    if plan.attention == "flash" and plan.batch_size > 1:
        raise InputError("--packing", "documents with --attention flash needs --batch-size 1 (transformers reads "
                                      "document starts for flash only in a one-row batch); use --attention sdpa, "
                                      "or --batch-size 1 with a longer --seq-len")
    if spec is None:
        return
    if spec.task != "causal-lm":
        raise InputError("--packing", f"documents packs causal-lm text; {spec.name} is set up for {spec.task}: "
                                      "use --packing stream")
    if spec.family not in DOCUMENT_MASK_FAMILIES:
        raise InputError("--packing", f"documents needs a model family whose attention reads packed position ids "
                                      f"({', '.join(DOCUMENT_MASK_FAMILIES)}); {spec.name} is "
                                      f"{spec.family or 'a model function'}: use --packing stream")
