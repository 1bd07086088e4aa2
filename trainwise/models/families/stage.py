"""Pipeline stages of unmodified decoders: what every family's stage shares.

A stage *references* the user's own submodules under their original attribute paths
(a block list's items, the embeddings, the final norm, `lm_head`), so its state dict is a
piece of the full model's with the same names and distributed checkpoints move between
layouts by those names. Each family's stage (in its module) repeats what the decoder's own
forward does between those modules (positions, position embeddings, causal mask).

A head tied to the token embedding (GPT-2, Llama 3.2 1B, Qwen2.5 0.5B) sits on the last
stage while the embedding sits on the first: each of the two ranks holds its own copy of
the one weight, and `tied_weight()` names it, for the pipeline to add the two gradients
before every optimizer step (so both copies stay equal, as one weight would be).
"""

from __future__ import annotations

import torch
from torch import nn

from trainwise.models.families.base import PipelineParts


class DecoderStage(nn.Module):
    """Blocks [first, end) of a causal LM, plus the embeddings (first stage) or the final
    norm and head (last stage), under their original names (the family's PipelineParts,
    `parts`). Subclasses, one per family, run them."""

    parts: PipelineParts
    sequence_shards: int = 1  # under sequence parallel, the slices of the sequence a later stage receives

    def __init__(self, causal_lm: nn.Module, first: int, end: int, is_first: bool, is_last: bool):
        super().__init__()
        self.config = causal_lm.config
        self.is_first, self.is_last = is_first, is_last
        blocks = causal_lm.get_submodule(self.parts.blocks)
        self._attach(self.parts.blocks, nn.ModuleDict({str(i): blocks[i] for i in range(first, end)}))
        for path in (self.parts.first if is_first else ()) + (self.parts.last if is_last else ()):
            self._attach(path, causal_lm.get_submodule(path))
        self._tied = bool(getattr(self.config, "tie_word_embeddings", False))

    def _attach(self, path: str, module: nn.Module) -> None:
        """Put `module` at `path` in this stage, creating the empty parents on the way."""
        owner = self
        *parents, name = path.split(".")
        for parent in parents:
            if not hasattr(owner, parent):
                owner.add_module(parent, nn.Module())
            owner = getattr(owner, parent)
        owner.add_module(name, module)

    def blocks(self):
        return self.get_submodule(self.parts.blocks).values()

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's copy of a head weight tied to the embedding (the embedding's on the
        first stage, the head's on the last), read now: data parallel may have swapped it."""
        if not self._tied:
            return None
        if self.is_first:
            return self.get_submodule(self.parts.first[0]).weight
        if self.is_last:
            return self.get_submodule(self.parts.last[-1]).weight
        return None

    def sequence_length(self, tokens_or_hidden: torch.Tensor) -> int:
        """The whole sequence's length: the first stage gets whole sequences, a later one
        under sequence parallel this rank's slice of one."""
        return tokens_or_hidden.shape[1] * (1 if self.is_first else self.sequence_shards)

    def positions(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        return torch.arange(self.sequence_length(tokens_or_hidden), device=tokens_or_hidden.device).unsqueeze(0)

    def causal_mask(self, hidden: torch.Tensor, positions: torch.Tensor, kind: str = "full_attention"):
        """The mask the model's own forward gives blocks of attention `kind` ("full_attention"
        or "sliding_attention": Mistral's window, Qwen2's sliding layers), over the whole
        sequence (the attention gathers it even where `hidden` is a slice)."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        make = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
        whole = hidden.new_zeros(()).expand(hidden.shape[0], positions.shape[1], hidden.shape[-1])  # no memory
        return make(config=self.config, inputs_embeds=whole, attention_mask=None, past_key_values=None,
                    position_ids=positions)

    def attention_kind(self, block: int) -> str:
        """Per block where the config lists layer types (Qwen2), else one kind for the model:
        sliding where it sets a window (Mistral)."""
        layer_types = getattr(self.config, "layer_types", None)
        if layer_types:
            return layer_types[block]
        return "sliding_attention" if getattr(self.config, "sliding_window", None) is not None else "full_attention"
