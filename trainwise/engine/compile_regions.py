"""torch.compile of a model, block by block (regional compilation) or as a whole.

`--compile-scope blocks` (the default) compiles the forward of every transformer block of
each model part (every stack's: an encoder-decoder's encoder and decoder blocks,
techniques/block_stacks.py); the embeddings, final norm, head and loss stay
eager. The blocks of a model run the same code on the same shapes, so Dynamo traces the
first block once and the others reuse its compiled graph: the first step compiles one
block instead of the whole model, and the compile cache (engine/compile_cache.py) keeps
one small entry per block kind. `--compile-scope model` compiles each model part whole
(the Trainer's torch_compile), for models without repeated blocks and for comparison.

Only `forward` is compiled, not the module's call: hooks that wrappers put on a block
(FSDP2's all-gather, peft's) stay outside the compiled region and outside the checkpoint
that grad checkpointing puts inside `forward`, which Dynamo traces as one region.

Under tensor parallel a block's input can be the output of an asynchronous collective still
in flight (DTensor's row-wise vocab-parallel embedding all-reduces with async_op=True and
hands on the local tensor: an AsyncCollectiveTensor). PyTorch 2.13's compiled autograd
wrapper waits on such an input but returns its gradient as a plain tensor, which DTensor's
Redistribute backward (expecting a DTensor) cannot take: the step fails with "'Tensor'
object has no attribute '_local_tensor'". Each compiled block therefore gets a pre-hook that
waits for such inputs eagerly, through an autograd-recorded copy (see _settle_async_inputs)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.engine.compile_atomic_add import run_scatter_adds_in_aten
from trainwise.engine.compile_cache import enable_compile_cache
from trainwise.plan.plan import Plan
from trainwise.techniques.block_stacks import stacked_blocks


def compile_model_parts(parts: list[nn.Module], plan: Plan, *, in_place: bool) -> list[nn.Module]:
    """What the loop calls for each model part: the parts themselves without --compile.

    Per block, the parts themselves (their blocks compiled in place). With scope `model`,
    on one process a torch.compile wrapper per part (the uncompiled module stays what is
    saved) and with a mesh each part compiled in place (pipeline stages and FSDP2 keep their
    module objects). The compiler stack is checked first so a torch build without it is
    refused as bad input; the compile cache is turned on before anything compiles."""
    if not plan.compile:
        return parts
    _check_compiler_stack()
    enable_compile_cache()
    run_scatter_adds_in_aten(plan.device)  # before anything compiles: the choice is made at lowering
    mode = None if plan.compile_mode == "default" else plan.compile_mode
    for part in parts:
        _train_without_generation_cache(part)
    if plan.compile_scope == "blocks":
        for part in parts:
            compile_blocks(part, mode)
        return parts
    if in_place:
        for part in parts:
            part.compile(mode=mode)
        return parts
    return [torch.compile(part, mode=mode) for part in parts]


def compile_blocks(part: nn.Module, mode: str | None) -> int:
    """Compile the forward of each block of `part` in place; returns how many. A part with
    no repeated blocks is refused: compiling it whole is a different request."""
    blocks = transformer_blocks(part)
    if not blocks:
        base = getattr(part, "get_base_model", lambda: part)()
        raise InputError("--compile-scope", f"{type(base).__name__} has no repeated blocks to compile one by one; "
                                            "use --compile-scope model")
    for block in blocks:
        block.forward = torch.compile(block.forward, mode=mode)
        block.register_forward_pre_hook(_settle_async_inputs, with_kwargs=True)
    return len(blocks)


def compiled_blocks(part: nn.Module) -> list[nn.Module]:
    """The blocks of `part` whose forward compile_blocks compiled (for reports and tests)."""
    return [block for block in transformer_blocks(part) if hasattr(block.__dict__.get("forward"), "_torchdynamo_orig_callable")]


def transformer_blocks(part: nn.Module) -> list[nn.Module]:
    """The blocks of a model part: a pipeline stage's (held by name in a ModuleDict, see
    models/families/stage.py), else every block of its stacks (techniques/block_stacks.py:
    the blocks the time model prices as compiled regions); empty without any."""
    stage_blocks = getattr(getattr(part, "parts", None), "blocks", None)
    if isinstance(stage_blocks, str):
        return list(part.get_submodule(stage_blocks).values())
    return stacked_blocks(part)


def _settle_async_inputs(module: nn.Module, args: tuple, kwargs: dict):
    """A block's tensor inputs that are in-flight collectives (AsyncCollectiveTensor),
    replaced by a finished copy before the compiled forward sees them (module docstring).
    The copy is an ordinary op, so autograd routes its gradient back through DTensor's own
    to_local backward; one activation-sized copy, on the first block only (later blocks
    receive the compiled graph's plain outputs). Nothing is returned (no change) otherwise."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.utils._pytree import tree_leaves, tree_map_only

    if not any(isinstance(x, AsyncCollectiveTensor) for x in tree_leaves((args, kwargs))):
        return None
    return tree_map_only(AsyncCollectiveTensor, torch.clone, (args, kwargs))


def _train_without_generation_cache(part: nn.Module) -> None:
    """Call a Hugging Face model with use_cache=False. Training never reads the key/value
    cache a generation model builds by default, and each block writes its own layer of it,
    which Dynamo would guard on and recompile every block for (past its recompile limit,
    the rest would run eager). A call-time hook, so the saved config keeps the user's value."""
    base = getattr(part, "get_base_model", lambda: part)()
    config = getattr(base, "config", None)
    if not getattr(config, "use_cache", False) or "use_cache" not in _forward_parameters(base):
        return
    base.register_forward_pre_hook(lambda module, args, kwargs: (args, {**kwargs, "use_cache": False}),
                                   with_kwargs=True)


def _forward_parameters(module: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _check_compiler_stack() -> None:
    try:
        import torch._inductor  # noqa: F401 - fails early where the compiler stack is missing
    except ImportError as err:
        raise InputError("--compile", f"torch.compile is unavailable in this torch build ({err})") from None
