"""Which repeated block's work is being done: its forward call, or its backward pass.

A transformer is mostly stacks of identical blocks (`nn.ModuleList`s of one class). The
tracer tags every allocation and free with the block whose work it was, so that a trace
of a few blocks can be repeated into a trace of all of them
(trainwise/estimator/extrapolate.py).

Forward is easy: a block is running between its forward pre-hook and forward hook (and
the frees right after it returns, before the next module call, are its too: the model's
loop dropping the previous block's output).
Backward has no module hooks that do not change the graph, so tensor hooks mark it: when
the gradient of a block's output is complete, the block's backward starts (everything
after it in the stack is done, because every later block depends on this output); when
the gradient of its input is complete, it has ended. Gradient checkpointing recomputes
a block's forward inside that block's backward, so recomputation is attributed to it too.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves

from trainwise.techniques.block_stacks import block_stacks
from trainwise.trace.block_ids import NO_BLOCK


class BlockTracker:
    """Context manager: `context` is the id of the block whose work is being done now, or
    NO_BLOCK. That is the block whose forward is running, or whose backward is; or, from
    the return of a block's forward to the next module call, the block that returned (the
    model's loop drops the previous block's output there, on that block's behalf).

    Block ids index `blocks`, a list of (stack name, position in the stack)."""

    def __init__(self, model: nn.Module):
        self.stacks = block_stacks(model)  # the blocks the engine compiles, shards and checkpoints
        self.blocks: list[tuple[str, int]] = []
        self.modules: list[nn.Module] = []
        for stack_name, children in self.stacks:
            for position, child in enumerate(children):
                self.blocks.append((stack_name, position))
                self.modules.append(child)
        self._forward: list[int] = []  # blocks whose forward is running (innermost last)
        self._backward = NO_BLOCK
        self._returned = NO_BLOCK  # the block whose forward returned last
        self._handles = []

    @property
    def context(self) -> int:
        if self._forward:
            return self._forward[-1]
        return self._backward if self._backward != NO_BLOCK else self._returned

    @property
    def running(self) -> int:
        """The block whose forward or backward is running now, or NO_BLOCK (unlike
        `context`, not the block that just returned)."""
        return self._forward[-1] if self._forward else self._backward

    def reset(self) -> None:
        """Forget the backward marker and the last block returned (a new phase starts)."""
        self._backward = self._returned = NO_BLOCK

    # ------------------------------------------------------------------ hooks
    def _enter(self, block: int, module, args, kwargs):
        self._forward.append(block)
        hidden = kwargs.get("hidden_states")
        hidden = hidden if isinstance(hidden, torch.Tensor) else _first_tensor(args)
        if _records_backward(hidden):
            hidden.register_hook(partial(self._backward_ends, block))

    def _exit(self, block: int, module, args, output):
        if self._forward and self._forward[-1] == block:
            self._forward.pop()
        if not self._forward and _outside_backward():
            self._returned = block
        hidden = _first_tensor(output)
        if _records_backward(hidden):
            hidden.register_hook(partial(self._backward_starts, block))

    def _backward_starts(self, block: int, grad):
        self._backward = block

    def _backward_ends(self, block: int, grad):
        # A block's input is the previous block's output: that block's start may already
        # have been marked by the same gradient, so only end the block still marked.
        if self._backward == block:
            self._backward = NO_BLOCK

    def _any_module_called(self, module, *_):
        self._returned = NO_BLOCK

    def __enter__(self):
        self._handles.append(register_module_forward_pre_hook(self._any_module_called))
        for block, module in enumerate(self.modules):
            self._handles.append(module.register_forward_pre_hook(partial(self._enter, block), with_kwargs=True))
            self._handles.append(module.register_forward_hook(partial(self._exit, block)))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._forward.clear()
        self._backward = NO_BLOCK


def _first_tensor(tree) -> torch.Tensor | None:
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _records_backward(tensor: torch.Tensor | None) -> bool:
    """Whether a gradient will flow through `tensor` in a backward still to come (not a
    tensor recomputed inside backward by checkpointing, whose graph is thrown away)."""
    return (tensor is not None and tensor.requires_grad and torch.is_grad_enabled()
            and _outside_backward())


def _outside_backward() -> bool:
    return torch._C._current_graph_task_id() == -1  # not inside a running backward
