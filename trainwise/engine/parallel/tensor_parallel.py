"""Tensor parallel for unmodified Hugging Face models, with DTensor's parallelize_module.

Each block's attention and MLP are split Megatron-style: the first projections (q, k, v;
gate and up; BERT's intermediate) column-wise, so every rank computes its own heads and its
own slice of the hidden MLP units, and the projections back (o; down; BERT's outputs)
row-wise, whose partial results one all-reduce sums. The Hugging Face attention reshapes
with `-1` heads, so the local module needs no attribute changes.

The token embedding is vocab-parallel (each rank holds a slice of the rows; a masked
lookup and an all-reduce), and so is the causal-LM head, whose logits stay sharded over
the vocabulary into a vocab-parallel cross-entropy (`loss_parallel`): the full logits are
never gathered. Every other weight (norms, position embeddings, classifier heads) is a
replicated DTensor, so the optimizer and clipping see one kind of parameter.

Sequence parallel (`--sequence-parallel`, every family declaring a SequenceParallelPlan:
the Llama family, GPT-2, BERT): between the attention and MLP sub-blocks every rank holds
only its slice of the sequence. The first block cuts its input into sequence slices (no
communication); each norm the family names runs on its slice (SequenceParallel); the
attention and the MLP all-gather their input to the whole sequence and their row-wise
output projections reduce-scatter back to slices (in place of the all-reduce). After the
last block the final norm runs on slices and either a vocab-parallel head gathers them
(Llama) or they are gathered right after it (GPT-2, whose model reshapes by the whole
length; BERT, whose post-norm blocks end in their own norm: after its last block), so
whatever follows sees the whole sequence. The residual stream and the norms' saved
activations are thus divided by tp, for the same communication volume. The embeddings'
output stays whole so that position (and token-type) embeddings, the causal mask and
rotary embeddings are computed for the real sequence. Under pipeline parallel the stages
pass slices (pipeline_parallel.py).

Which modules are split, and how, is each family's declaration (trainwise/models/families/:
the Llama family, BERT and GPT-2); this module turns it into DTensor styles. Projections a
family declares transposed (GPT-2's Conv1D, and the q, k, v it fuses) are split by
conv1d_parallel.py; the size attributes a family names (GPT-2's split_size) are divided.

    model = apply_tensor_parallel(model, tp_mesh)
    with tensor_parallel_loss(model):   # around the loss computation *and* its backward
        loss = model(**batch).loss      # a replicated DTensor under the vocab-parallel loss
        loss.backward()
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, loss_parallel, parallelize_module)

from trainwise.engine.parallel.conv1d_parallel import ShardedConv1D
from trainwise.models.families import SequenceParallelPlan, family_of, replace_submodule
from trainwise.models.families.checks import check_tensor_parallel
from trainwise.common.errors import InputError

_VOCAB_PARALLEL_MARK = "_trainwise_vocab_parallel_head"


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> nn.Module:
    """Split `model` over `tp_mesh` in place (see the module docstring); returns it."""
    base = getattr(model, "get_base_model", lambda: model)()
    config = base.config
    family = check_tensor_parallel(config, tp_mesh.size(), sequence_parallel) or family_of(config)  # tp 1: no check
    core = family.blocks_owner(base)
    if core is None:
        raise InputError("--tp", f"{type(base).__name__} has no {family.blocks} to split")
    embedding = base.get_input_embeddings()
    head = base.get_output_embeddings()
    vocab_parallel = head is not None and family.vocab_parallel_head
    blocks = core.get_submodule(family.blocks)
    for block in blocks:
        styles = {}
        for path, kind in family.tensor_parallel.items():
            if path in family.transposed:
                replace_submodule(block, path, ShardedConv1D(block.get_submodule(path), tp_mesh, kind,
                                                             family.fused_projections.get(path, 1), sequence_parallel))
            else:
                styles[path] = _style(kind, sequence_parallel, block.get_submodule(path))
        family.divide_local_sizes(block, tp_mesh.size())
        if sequence_parallel:
            styles.update(_sequence_parallel_styles(family.sequence_parallel))
        if styles:
            parallelize_module(block, tp_mesh, styles)
    tied = head is not None and head.weight is embedding.weight
    parallelize_module(embedding, tp_mesh, RowwiseParallel(input_layouts=Replicate()))
    head_slices = sequence_parallel and vocab_parallel and family.sequence_parallel.head_takes_slices
    if sequence_parallel:
        _cut_and_gather_sequence(core, family.sequence_parallel, blocks, tp_mesh, gather=not head_slices)
    if vocab_parallel:
        parallelize_module(head, tp_mesh, ColwiseParallel(input_layouts=Shard(1) if head_slices else Replicate(),
                                                          output_layouts=Shard(-1), use_local_output=False))
        if tied:
            head.weight = embedding.weight  # one sharded parameter, as before
        setattr(base, _VOCAB_PARALLEL_MARK, True)
    _replicate_the_rest(base, tp_mesh)
    return model


@contextlib.contextmanager
def tensor_parallel_loss(model: nn.Module):
    """The context the loss and its backward must run in: vocab-parallel cross-entropy
    when the head's logits are sharded over the vocabulary, else nothing."""
    base = getattr(model, "get_base_model", lambda: model)()
    if getattr(base, _VOCAB_PARALLEL_MARK, False):
        with loss_parallel():
            yield
    else:
        yield


def keep_embedding_gradient_sharded(model: nn.Module) -> None:
    """DTensor's embedding backward returns the vocab-parallel weight's gradient
    replicated: a full vocab x hidden tensor on every rank (2 GB in fp32 for Llama 3's
    128k vocabulary at hidden 4096). Re-shard it like the weight as it arrives, a local
    slice with no communication, and copy the slice so the full tensor is freed.

    Call it once the parameters have reached their final device and dtype: moving or
    casting a DTensor parameter swaps its tensor, and the hook would stay behind."""
    base = getattr(model, "get_base_model", lambda: model)()
    param = base.get_input_embeddings().weight
    if not isinstance(param, DTensor):
        return

    def like_parameter(grad):
        if not isinstance(grad, DTensor) or grad.placements == param.placements:
            return grad
        local = grad.redistribute(param.device_mesh, param.placements).to_local().clone()
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())

    param.register_hook(like_parameter)


def _style(kind: str, sequence_parallel: bool = False, module: nn.Module | None = None):
    """DTensor's style for a projection, or torchao's float8 variant of it for a layer
    already converted to Float8Linear (same sharding; the input is cast to float8 with a
    dynamic scale after it becomes a DTensor, and the output's gradient before backward)."""
    if type(module).__name__ == "Float8Linear":
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel as Colwise
        from torchao.float8.float8_tensor_parallel import Float8RowwiseParallel as Rowwise
    else:
        Colwise, Rowwise = ColwiseParallel, RowwiseParallel
    if kind == "colwise":
        return Colwise()
    # Under sequence parallel the partial sums are reduce-scattered into sequence slices.
    return Rowwise(output_layouts=Shard(1)) if sequence_parallel else Rowwise()


def convert_float8_before_split(model: nn.Module, plan, tp: int) -> nn.Module:
    """--float8 with --tp: torchao's float8 styles need Float8Linear layers, so the block
    projections the family splits are converted first (the recipe's float8 step later
    leaves them as they are), judged on the widths one rank multiplies. Layers outside the
    family's split (replicated) stay bf16."""
    from trainwise.techniques.float8 import apply_float8

    base = getattr(model, "get_base_model", lambda: model)()
    family = family_of(base.config)
    blocks = f"{family.blocks}."

    def local_widths(module: nn.Module, name: str):
        inside = name.split(blocks, 1)[-1].split(".", 1)[-1] if blocks in name else None
        kind = family.tensor_parallel.get(inside) if inside not in family.transposed else None
        if kind == "colwise":
            return module.in_features, module.out_features // tp
        if kind == "rowwise":
            return module.in_features // tp, module.out_features
        return None

    return apply_float8(model, plan, local_widths)


def _cut_and_gather_sequence(core: nn.Module, plan: SequenceParallelPlan, blocks: nn.ModuleList, mesh: DeviceMesh,
                             gather: bool) -> None:
    """The sequence's two edges: the first block's input (its first positional argument,
    whole on every rank) is cut into this rank's slice, a local slice with no
    communication; the final norm runs on slices; with `gather`, the output of the final
    norm (or of the last block, where there is none) is all-gathered to the whole sequence."""
    blocks[0].register_forward_pre_hook(lambda module, args: (_slice_of_sequence(args[0], mesh), *args[1:]))
    last = blocks[len(blocks) - 1]
    if plan.final_norm is not None:
        last = core.get_submodule(plan.final_norm)
        parallelize_module(last, mesh, SequenceParallel(use_local_output=True))
    if gather:
        parallelize_module(last, mesh, PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate(),
                                                           use_local_output=True))


def _slice_of_sequence(hidden: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """This rank's slice of a whole sequence (dim 1); the gradients of the slices are
    gathered back into the whole one's."""
    return DTensor.from_local(hidden, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(1)]).to_local()


def _sequence_parallel_styles(plan: SequenceParallelPlan) -> dict:
    """A block's entries under sequence parallel (on top of the column/row-wise plan): its
    norms run on sequence slices; its sub-blocks all-gather their input, passed by keyword
    (`hidden_states`) or as the first positional argument, to the whole sequence."""
    styles = {norm: SequenceParallel(use_local_output=True) for norm in plan.norms}
    for module in plan.gather_keyword:
        styles[module] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                            use_local_output=True)
    for module in plan.gather_positional:
        styles[module] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                            use_local_output=True)
    return styles


def _replicate_the_rest(model: nn.Module, mesh: DeviceMesh) -> None:
    """Every module still holding plain parameters gets them as replicated DTensors and
    converts its inputs and outputs at its boundary, so the code around it is unchanged."""
    for module in list(model.modules()):
        own = [p for p in module.parameters(recurse=False)]
        if not own or all(isinstance(p, DTensor) for p in own):
            continue
        distribute_module(module, mesh, _replicate_parameters, input_fn=_replicated_inputs,
                          output_fn=_local_outputs)


def _replicate_parameters(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    for param_name, param in list(module.named_parameters(recurse=False)):
        if isinstance(param, DTensor):
            continue
        replicated = nn.Parameter(distribute_tensor(param.data, mesh, [Replicate()]),
                                  requires_grad=param.requires_grad)
        module.register_parameter(param_name, replicated)


def _replicated_inputs(module, inputs, mesh):
    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                 if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)


def _local_outputs(module, outputs, mesh):
    if isinstance(outputs, DTensor):
        return outputs.to_local()
    if isinstance(outputs, tuple):
        return tuple(o.to_local() if isinstance(o, DTensor) else o for o in outputs)
    return outputs
