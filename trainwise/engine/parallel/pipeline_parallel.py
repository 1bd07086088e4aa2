"""Pipeline parallel for unmodified decoders, on torch.distributed.pipelining.

The model is cut at block boundaries into `pp` stages (2 x pp under interleaved 1F1B,
stage s on rank s mod pp), as even in blocks as they can be: the first stage also holds
the token embedding, the last the final norm, the head and the loss. A stage is a small
module that *references* the user's own submodules under their original attribute paths
(`model.layers.7`, `lm_head`, ...), so its state dict is a piece of the full model's with
the same names: distributed checkpoints move between layouts by those names. Its
forward repeats what the decoder's own forward does between those modules (positions,
rotary embeddings, causal mask): that is the one per-family piece of code here.

Each `step(batch)` splits the micro-batch into `microbatches` pipeline chunks and runs
them through the schedule (GPipe, 1F1B or interleaved 1F1B), which overlaps the stages'
work and sends activations and their gradients between neighbouring ranks.

Supported: the Llama family (Llama, Mistral, Qwen2) with untied embeddings and packed
(unpadded) sequences.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from trainwise.engine.parallel.reduce import plain_loss
from trainwise.plan.errors import InputError
from trainwise.plan.partition import balanced_bounds, rank_stages, stages_per_rank

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}


class DecoderStage(nn.Module):
    """Blocks [first, end) of a Llama-family causal LM, plus the embedding (first stage)
    or the final norm and head (last stage), under their original names."""

    def __init__(self, causal_lm: nn.Module, first: int, end: int, is_first: bool, is_last: bool):
        super().__init__()
        core = causal_lm.model
        self.config = causal_lm.config
        self.is_first, self.is_last = is_first, is_last
        self.model = nn.Module()
        if is_first:
            self.model.embed_tokens = core.embed_tokens
        self.model.layers = nn.ModuleDict({str(i): core.layers[i] for i in range(first, end)})
        self.model.rotary_emb = core.rotary_emb  # buffers only, needed by every stage
        if is_last:
            self.model.norm = core.norm
            self.lm_head = causal_lm.lm_head

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        hidden = self.model.embed_tokens(tokens_or_hidden) if self.is_first else tokens_or_hidden
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                                  past_key_values=None, position_ids=positions)
        rotary = self.model.rotary_emb(hidden, position_ids=positions)
        for layer in self.model.layers.values():
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        if self.is_last:
            return self.lm_head(self.model.norm(hidden))
        return hidden


class PipelineRunner:
    """This rank's stages and the schedule that runs them. `step(batch)` runs forward and
    backward of one micro-batch, accumulating into the stages' gradients, and returns its
    mean loss on the rank holding the last stage (None elsewhere)."""

    def __init__(self, stages: list[DecoderStage], schedule, loss_scale: float):
        self.stages, self._schedule, self._loss_scale = stages, schedule, loss_scale
        self.is_last = any(stage.is_last for stage in stages)

    def step(self, batch: dict) -> torch.Tensor | None:
        mask = batch.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise InputError("--pp", "pipeline parallel trains packed sequences without padding; this batch pads")
        losses: list = []
        self._schedule.step(batch["input_ids"], target=batch["labels"], losses=losses)
        if not self.is_last:
            return None
        # Each chunk's loss came back scaled for accumulation and averaging: undo it.
        return torch.stack([plain_loss(loss).detach() for loss in losses]).sum() / self._loss_scale


def build_pipeline(model: nn.Module, pp_mesh: DeviceMesh, *, schedule: str, microbatches: int,
                   device: torch.device, loss_scale: float = 1.0) -> PipelineRunner:
    """Cut `model` into this rank's stages and build the schedule over `pp_mesh`."""
    pp = pp_mesh.size()
    base = getattr(model, "get_base_model", lambda: model)()
    rank = pp_mesh.get_local_rank()
    total = pp * stages_per_rank(schedule)
    bounds = balanced_bounds(base.config.num_hidden_layers, total)
    indices = rank_stages(rank, pp, schedule)
    modules = [DecoderStage(base, *bounds[i], is_first=i == 0, is_last=i == total - 1).to(device) for i in indices]
    _drop_other_blocks(base, {b for i in indices for b in range(*bounds[i])})
    group = pp_mesh.get_group()
    stages = [PipelineStage(module, i, total, device, group=group) for module, i in zip(modules, indices)]
    loss_function = base.loss_function
    vocab = base.config.vocab_size

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Mean over the chunk's tokens as the model's own loss computes it; chunks add up
        # (scale_grads off below), so each carries 1/microbatches and the accumulation scale.
        return loss_function(logits=logits, labels=labels, vocab_size=vocab) * (loss_scale / microbatches)

    schedule_class = _SCHEDULES[schedule]
    runner_schedule = schedule_class(stages if schedule == "interleaved-1f1b" else stages[0], microbatches,
                                     loss_fn=loss, scale_grads=False)
    return PipelineRunner(modules, runner_schedule, loss_scale)


def _drop_other_blocks(causal_lm: nn.Module, kept: set[int]) -> None:
    """Let go of the blocks other ranks hold, so their memory is freed on this one (the
    model object is consumed by the pipeline; its stages keep what they need)."""
    layers = causal_lm.model.layers
    for index in range(len(layers)):
        if index not in kept:
            layers[index] = nn.Identity()
