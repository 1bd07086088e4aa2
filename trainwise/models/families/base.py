"""What a model family must say for tensor, sequence and pipeline parallel to cut it.

A family is a set of Hugging Face model types with the same module names. Its module
(models/families/<name>.py) declares one ModelFamily: pure data about module paths plus,
for pipelining, the stage forward. The engine turns the data into DTensor styles and
pipeline stages (engine/parallel/), the checkpoints into their stored shapes, and the
per-rank estimate into each rank's shapes (estimator/), so all three read the same facts.
No torch.distributed here: a family says *what* is split, never how."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass(frozen=True)
class SequenceParallelPlan:
    """Sequence parallel as data, on top of the tensor-parallel plan: the block's norms
    that run on sequence slices, the sub-blocks that all-gather their input to the whole
    sequence (called with the keyword argument `hidden_states`, or with it as their first
    positional argument), and the norm after the last block (a path under the module
    owning the blocks; None where the blocks end in their own norm, as BERT's post-norm
    blocks do). `head_takes_slices`: whether the final norm's slices go into a
    vocab-parallel head as they are (its column-wise input gathers them); otherwise the
    sequence is gathered right after the final norm (or the last block), because the
    model's own code reshapes it by the whole length (GPT-2) or a head pools over it."""

    norms: tuple[str, ...]
    gather_keyword: tuple[str, ...]
    gather_positional: tuple[str, ...]
    final_norm: str | None
    head_takes_slices: bool = False


@dataclass(frozen=True)
class PipelineParts:
    """Where a decoder family keeps its blocks, and the modules its first stage holds
    besides blocks (the embeddings) and its last stage (final norm, head); the first of
    `first` is the token embedding and the last of `last` the head (tied or not). Paths
    from the causal LM's root."""

    blocks: str
    first: tuple[str, ...]
    last: tuple[str, ...]

    def holds(self, module: str, paths: tuple[str, ...]) -> bool:
        """Whether module name `module` is one of `paths` or inside one."""
        return any(module == path or module.startswith(path + ".") for path in paths)


@dataclass(frozen=True)
class ModelFamily:
    """Everything the parallel engine, the checkpoint shapes and the per-rank estimate
    need to know about one family.

    blocks              path of the block list under whichever module owns it (a head
                        model wraps the core model under various names)
    tensor_parallel     {module path inside a block: "colwise" | "rowwise"}: column-wise
                        splits a projection's output features (weight and bias), row-wise
                        its input features (the bias stays whole)
    transposed          the planned projections that are Conv1D (weight [in, out])
    fused_projections   {module path inside a block: how many equal projections its output
                        concatenates}; split per part, stored [in, parts, out / parts]
    local_sizes         attributes (paths inside a block) holding a size tensor parallel
                        divides: the heads a rank computes, where the code keeps them
    heads_in_config     whether the config states the head size, so that dividing the
                        head counts and MLP width in the config gives a rank's shapes
    vocab_parallel_head whether a causal-LM head is split over the vocabulary (its logits
                        go sharded into the vocab-parallel loss)
    sequence_parallel   the sequence-parallel plan, None where it is not implemented
    pipeline, stage     the pipeline parts and the stage module (models/families/stage.py)
                        running them; None where pipelining is not implemented
    """

    name: str
    model_types: tuple[str, ...]
    blocks: str
    tensor_parallel: dict[str, str]
    transposed: tuple[str, ...] = ()
    fused_projections: dict[str, int] = field(default_factory=dict)
    local_sizes: tuple[str, ...] = ()
    heads_in_config: bool = False
    vocab_parallel_head: bool = False
    sequence_parallel: SequenceParallelPlan | None = None
    pipeline: PipelineParts | None = None
    stage: type | None = None

    def block_list(self, model: nn.Module) -> nn.ModuleList | None:
        """The model's blocks (`blocks` under whichever submodule owns them), or None."""
        owner = self.blocks_owner(model)
        return None if owner is None else owner.get_submodule(self.blocks)

    def blocks_owner(self, model: nn.Module) -> nn.Module | None:
        """The module of `model` that owns `blocks`, or None."""
        for _, module in model.named_modules():
            try:
                module.get_submodule(self.blocks)
                return module
            except AttributeError:
                continue
        return None

    def divide_local_sizes(self, block: nn.Module, tp: int) -> None:
        """Divide by tp the size attributes a block keeps for the heads a rank computes, in place."""
        for path in self.local_sizes:
            owner, _, name = path.rpartition(".")
            module = block.get_submodule(owner)
            setattr(module, name, getattr(module, name) // tp)


def replace_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` at `path` (dotted) under `root`, in place of what is there."""
    owner, _, name = path.rpartition(".")
    setattr(root.get_submodule(owner) if owner else root, name, module)
