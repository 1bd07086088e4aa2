"""Which modules are a model's transformer blocks: one rule for the trace and the engine.

A stack is a ModuleList of at least two modules of one class that is not inside another
stack (the experts inside a block are part of the block). An encoder-decoder has two
stacks (T5: `encoder.block` and `decoder.block`), a vision-language model one per tower.

The trace tags work by these blocks and prices compiled regions, checkpointing and
activation offload per block (trainwise/trace/blocks.py); the engine compiles, shards
(FSDP2), checkpoints and offloads the same modules. An engine that took "the longest
ModuleList" instead compiled, for tiny-t5 (two blocks per stack), the three sublayers
of the first decoder block (`decoder.block.0.layer`) and none of the blocks the time
model priced as compiled; for t5-small, the encoder's blocks and not the decoder's."""

from __future__ import annotations

from torch import nn


def block_stacks(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """(qualified name, blocks) of every stack of `model`, in the order named_modules
    meets them."""
    stacks = []
    inside: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in inside or not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        children = list(module)
        if len({type(child) for child in children}) != 1:
            continue
        stacks.append((name, children))
        inside.update(id(m) for child in children for m in child.modules())
    return stacks


def stacked_blocks(model: nn.Module) -> list[nn.Module]:
    """Every block of every stack of `model`, stack after stack; empty without a stack."""
    return [block for _, blocks in block_stacks(model) for block in blocks]
