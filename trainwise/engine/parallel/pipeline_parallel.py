"""Pipeline parallel for unmodified decoders, on torch.distributed.pipelining.

The model is cut at block boundaries into `pp` stages (2 x pp under interleaved 1F1B,
stage s on rank s mod pp), as even in blocks as they can be: the first stage also holds
the token embedding, the last the final norm, the head and the loss. The stage modules
(each family's, trainwise/models/families/) keep the model's own parameter names.

Each `step(batch)` splits the micro-batch into `microbatches` pipeline chunks and runs
them through the schedule (GPipe, 1F1B or interleaved 1F1B), which overlaps the stages'
work and sends activations and their gradients between neighbouring ranks. When the head
is tied to the embedding, `finish_gradients()` adds the first stage's and the last
stage's gradients of that weight (an all-reduce between those two ranks) once the step's
backward is done.

Under sequence parallel the stages pass their sequence slices (each tensor-parallel rank
to its peer of the next stage: 1/tp of the whole activation per send, where gathering
at every edge would send all of it and cut it again); a stage after the first derives
the whole length, its positions and its causal mask from the slice times tp.

Supported: the families declaring pipeline parts and a stage (the Llama family: Llama,
Mistral, Qwen2; GPT-2), with packed (unpadded) sequences.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor

from trainwise.engine.parallel.reduce import all_reduce_in_place, plain_loss
from trainwise.models.families.checks import pipeline_family
from trainwise.models.families.stage import DecoderStage
from trainwise.common.errors import InputError
from trainwise.plan.partition import balanced_bounds, rank_stages, stages_per_rank

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}


class PipelineRunner:
    """This rank's stages and the schedule that runs them. `step(batch)` runs forward and
    backward of one micro-batch, accumulating into the stages' gradients, and returns its
    mean loss on the rank holding the last stage (None elsewhere)."""

    def __init__(self, stages: list[DecoderStage], schedule, loss_scale: float, tied_group=None):
        self.stages, self._schedule, self._loss_scale = stages, schedule, loss_scale
        self.is_last = any(stage.is_last for stage in stages)
        self._tied_group = tied_group  # this rank's first/last-stage pair, when the head is tied

    def tied_weights(self) -> list[nn.Parameter]:
        """This rank's copies of a tied head/embedding weight (none on middle stages)."""
        return [weight for stage in self.stages if (weight := stage.tied_weight()) is not None]

    def counted_elsewhere(self) -> list[nn.Parameter]:
        """Parameters whose gradient the first stage's rank already counts in the global
        gradient norm: the last stage's copy of a tied weight."""
        return [stage.tied_weight() for stage in self.stages if stage.is_last and stage.tied_weight() is not None]

    def finish_gradients(self) -> None:
        """After the step's last backward: both copies of a tied weight get the sum of
        their gradients, so the two ranks' optimizers make the same update."""
        for weight in self.tied_weights():
            grad = weight.grad
            if grad is None:  # no gradient reached this copy; the other rank still waits for this one
                grad = weight.grad = torch.zeros_like(weight)
            all_reduce_in_place(grad.to_local() if isinstance(grad, DTensor) else grad, self._tied_group)

    @staticmethod
    def check_batch(host_batch: dict) -> None:
        """Refuse a padded micro-batch. Called on the loader's host copy, before it moves
        to the device: reading a device mask would wait for the device every micro-batch."""
        mask = host_batch.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise InputError("--pp", "pipeline parallel trains packed sequences without padding; this batch pads")

    def step(self, batch: dict) -> torch.Tensor | None:
        """Forward and backward of one micro-batch (already checked by `check_batch`)."""
        losses: list = []
        self._schedule.step(batch["input_ids"], target=batch["labels"], losses=losses)
        if not self.is_last:
            return None
        # Each chunk's loss came back scaled for accumulation and averaging: undo it.
        return torch.stack([plain_loss(loss).detach() for loss in losses]).sum() / self._loss_scale


def build_pipeline(model: nn.Module, mesh: DeviceMesh, *, schedule: str, microbatches: int,
                   device: torch.device, loss_scale: float = 1.0, sequence_shards: int = 1) -> PipelineRunner:
    """Cut `model` into this rank's stages and build the schedule over the "pp" dimension
    of the run's `mesh`; `sequence_shards`: the slices of a sequence the stages pass (tp
    under sequence parallel, else 1)."""
    pp_mesh = mesh["pp"]
    pp = pp_mesh.size()
    base = getattr(model, "get_base_model", lambda: model)()
    family = pipeline_family(base.config)
    rank = pp_mesh.get_local_rank()
    total = pp * stages_per_rank(schedule)
    bounds = balanced_bounds(base.config.num_hidden_layers, total)
    indices = rank_stages(rank, pp, schedule)
    modules = [family.stage(base, *bounds[i], is_first=i == 0, is_last=i == total - 1).to(device) for i in indices]
    for module in modules:
        module.sequence_shards = sequence_shards
    kept = {block for i in indices for block in range(*bounds[i])}
    _drop_other_blocks(base.get_submodule(family.pipeline.blocks), kept)
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
    tied_group = _first_last_group(mesh) if getattr(base.config, "tie_word_embeddings", False) else None
    return PipelineRunner(modules, runner_schedule, loss_scale, tied_group)


def _first_last_group(mesh: DeviceMesh):
    """The process group of the first and the last pipeline rank that share this rank's
    other mesh coordinates (None on the ranks between them). Every rank creates every
    pair's group, as torch.distributed requires."""
    import torch.distributed as dist

    ranks = mesh.mesh.movedim(mesh.mesh_dim_names.index("pp"), -1).reshape(-1, mesh["pp"].size())
    mine = None
    for row in ranks.tolist():
        group = dist.new_group([row[0], row[-1]])
        if dist.get_rank() in (row[0], row[-1]):
            mine = group
    return mine


def _drop_other_blocks(blocks: nn.ModuleList, kept: set[int]) -> None:
    """Let go of the blocks other ranks hold, so their memory is freed on this one (the
    model object is consumed by the pipeline; its stages keep what they need)."""
    for index in range(len(blocks)):
        if index not in kept:
            blocks[index] = nn.Identity()
