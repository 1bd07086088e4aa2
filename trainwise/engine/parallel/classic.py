"""The two one-process layouts people compare against (`--classic`).

data-parallel: torch.nn.DataParallel. One process scatters each micro-batch over the
    visible GPUs, replicates the model every step, gathers outputs on the first GPU. Easy
    and slow (the replication and the single Python thread): DDP is the fix.
vertical: naive model parallel. The blocks of every stack (an encoder-decoder's encoder
    blocks, then its decoder blocks) are placed on the GPUs in order (embeddings on the
    first, the head on the last) and the activations hop from GPU to GPU; one GPU works
    at a time. Pipeline parallel (--pp) is the fix.

Without several GPUs either would run on the one device there is and change nothing, so
`--classic` is refused there (a CPU, one visible GPU) rather than ignored; the placement
itself is tested with the CPU standing in for each GPU."""

from __future__ import annotations

import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan
from trainwise.techniques.block_stacks import stacked_blocks


def classic_devices(device: torch.device) -> list[torch.device]:
    """The devices a classic layout spreads over: every visible GPU, else `device` alone."""
    if device.type == "cuda":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


def data_parallel_module(model: nn.Module, devices: list[torch.device]) -> nn.Module:
    """nn.DataParallel over `devices` (the model must sit on the first)."""
    if devices[0].type != "cuda":
        return model  # DataParallel has nothing to split on a CPU: the model runs as is
    return nn.DataParallel(model, device_ids=[d.index for d in devices], output_device=devices[0].index)


def place_vertically(model: nn.Module, devices: list[torch.device]) -> list[torch.device]:
    """Move the blocks of every stack (techniques/block_stacks.py: an encoder-decoder's
    encoder blocks, then its decoder blocks) to `devices` in order, in balanced contiguous
    runs, place the modules outside them (`outside_devices`), and make every block and
    every module holding weights move its inputs to its own device first. Returns the
    device of each block."""
    blocks = stacked_blocks(model)
    if not blocks:
        raise InputError("--classic", f"vertical needs repeated blocks to place; {type(model).__name__} has none")
    model.to(devices[0])  # embeddings and everything before the first block start on the first device
    placement = assign_blocks(len(blocks), devices)
    for block, device in zip(blocks, placement):
        block.to(device)
        block.register_forward_pre_hook(_inputs_to(device), with_kwargs=True)
    for _, module, device in outside_devices(model, blocks, placement, devices[-1]):
        module.to(device)
    _inputs_to_weights(model, blocks)
    return placement


def assign_blocks(count: int, devices: list) -> list:
    """The device of each of `count` blocks: contiguous runs, as even as they can be."""
    return [devices[index * len(devices) // count] for index in range(count)]


def outside_devices(model: nn.Module, blocks: list[nn.Module], placement: list,
                    last) -> list[tuple[str, nn.Module, object]]:
    """(name, module, device) of each leaf module outside the blocks that leaves the first
    device (a parent with children moves with them).

    A module between two stacks (T5's encoder final norm and dropout, a vision tower's
    post-norm and projector) goes with the last block before it: it takes that stack's
    output, so the activations hop once, to the next stack's first block, rather than back
    to the first device and on again (the next stack's own embedding, registered before
    its blocks, goes along: it reads token ids, and a tied one is wherever its last
    sharer was put). A module after the last stack (final norm, head)
    goes to the `last` device, as it did with one stack, even where there are fewer blocks
    than devices. Everything before the first block stays on the first device."""
    device_of = {id(block): device for block, device in zip(blocks, placement)}
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    placed, current, remaining = [], None, len(blocks)
    for name, module in model.named_modules():
        if id(module) in device_of:
            current, remaining = device_of[id(module)], remaining - 1
            continue
        if id(module) in in_blocks or list(module.children()) or current is None:
            continue
        placed.append((name, module, current if remaining else last))
    return placed


def _inputs_to_weights(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Every module outside the blocks that holds weights moves its inputs to where its
    weights are (a head tied to the embedding drags the embedding along, so both need it)."""
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    for module in model.modules():
        if id(module) in in_blocks or list(module.children()) or not list(module.parameters(recurse=False)):
            continue
        weight_device = next(module.parameters(recurse=False)).device
        module.register_forward_pre_hook(_inputs_to(weight_device), with_kwargs=True)


def _inputs_to(device: torch.device):
    def move(module, args, kwargs):
        return _move(args, device), _move(kwargs, device)
    return move


def _move(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def apply_classic(model: nn.Module, forward: nn.Module, plan: Plan, device: torch.device) -> nn.Module:
    """What the loop calls under `--classic`: nn.DataParallel around `forward`, or `forward`
    itself once the blocks of `model` are placed vertically over the visible GPUs."""
    # One process over at least two GPUs: anything else was refused up front
    # (trainwise/api/compatibility.py), since it would change nothing.
    devices = classic_devices(device)
    if plan.classic == "vertical":
        place_vertically(model, devices)
        return forward
    return data_parallel_module(forward, devices)
