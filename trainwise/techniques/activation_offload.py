"""Activation offload: the tensors autograd saves for backward inside the transformer
blocks go to host memory during forward and come back for backward.

Each block's forward runs under saved-tensor hooks, installed on the block instance and so
outside any checkpoint (under --grad-ckpt what the checkpoint saves, the block's input, is
what moves: the classic pairing; the recomputed internals stay on the device as usual).

* pack (forward), on CUDA: the tensor is copied into pinned host memory on a side stream
  that first waits for the compute stream; the forward goes on without waiting (the copy
  overlaps the rest of the forward), and the allocator is told (`record_stream`) not to
  reuse the device memory before the copy ends.
* unpack (backward): the first tensor backward needs from a block brings back every tensor
  of that block, and those of the block before it (the next one backward reaches) are
  prefetched, all on the side stream; the compute stream waits only for the block it
  needs. So the copy back of the first block backward reaches (the last block of forward)
  is exposed, the others overlap the backward of the block after them.

Not moved: parameters and what a view or cast makes of them (weights stay where they are),
tensors that do not require grad (masks, the position tables every block reads), tensors
under MIN_OFFLOAD_BYTES (a copy's fixed cost outweighs what it frees), and anything
already in host memory. On the CPU the hooks would move nothing (host memory is where
the tensors already are), so a request for it there is refused (api/compatibility.py). Saved tensors of the embeddings, the head and the loss are not
in a block and stay where they are."""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn

from trainwise.common.errors import InputError

# Smallest saved tensor worth a copy (bytes): a PCIe copy's ~10 us fixed cost moves ~200 KiB.
MIN_OFFLOAD_BYTES = 64 * 1024
FLAG = "--activation-offload"
# Attribute of a prepared model holding its offloader (the trace configures it).
OFFLOADER_ATTRIBUTE = "_trainwise_activation_offloader"
# Autograd nodes that only view or cast their one input: a saved tensor reached from a
# parameter through these is the parameter's, not an activation.
_VIEWS_AND_CASTS = {"TBackward0", "ToCopyBackward0", "ViewBackward0", "UnsafeViewBackward0", "PermuteBackward0",
                    "TransposeBackward0", "ExpandBackward0", "AliasBackward0", "SliceBackward0"}


class _Saved:
    """One moved tensor: its host copy, its device copy once fetched, and the event that
    says the device copy is complete (CUDA only)."""

    __slots__ = ("host", "device", "ready", "home", "__weakref__")

    def __init__(self, host: torch.Tensor, home: torch.device):
        self.host, self.device, self.ready, self.home = host, None, None, home


class ActivationOffloader:
    """Saved-tensor hooks for the blocks of one model (see the module docstring).

    `simulate_device_type`: treat host tensors as if they lived on this device type (the
    trace runs on fake host tensors for a CUDA target; a test runs the copies on the CPU).
    `on_host_copy(tensor)` / `on_kept(tensor)`: told of each host copy made and each saved
    tensor kept as it is (the trace's bookkeeping)."""

    def __init__(self, min_bytes: int = MIN_OFFLOAD_BYTES):
        self.min_bytes = min_bytes
        self.simulate_device_type: str | None = None
        self.on_host_copy = None
        self.on_kept = None
        self.moved_bytes = 0  # bytes copied to host so far (every forward)
        self._pass = 0
        self._waiting: dict[tuple[int, int], list[weakref.ref]] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        # The current block's copies by view (_view_key), so a tensor saved twice moves once.
        self._copied: dict[tuple, tuple[weakref.ref, _Saved]] = {}

    def wrap(self, index: int, forward):
        """Block `index`'s forward, run under this offloader's hooks."""
        @functools.wraps(forward)
        def offloaded_forward(*args, **kwargs):
            if index == 0:
                self._new_pass()
            pack = functools.partial(self._pack, (self._pass, index))
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                    return forward(*args, **kwargs)
            finally:
                self._copied = {}
        return offloaded_forward

    # ---------------------------------------------------------------- forward
    def _pack(self, key: tuple[int, int], tensor: torch.Tensor):
        if not self._worth_moving(tensor):
            if self.on_kept is not None:
                self.on_kept(tensor)
            return tensor
        same = self._copied.get(_view_key(tensor))
        if same is not None and same[0]() is tensor.untyped_storage():
            return key, same[1]  # saved again by another op (q, k and v read one input): one copy
        saved = _Saved(self._to_host(tensor), tensor.device)
        self._copied[_view_key(tensor)] = (weakref.ref(tensor.untyped_storage()), saved)
        self.moved_bytes += tensor.numel() * tensor.element_size()
        if self.on_host_copy is not None:
            self.on_host_copy(saved.host)
        self._waiting.setdefault(key, []).append(weakref.ref(saved))
        return key, saved

    def _worth_moving(self, tensor: torch.Tensor) -> bool:
        device_type = self.simulate_device_type or tensor.device.type
        return (device_type != "cpu" and tensor.requires_grad
                and tensor.numel() * tensor.element_size() >= self.min_bytes and not from_parameter(tensor))

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cuda":  # simulated: a plain copy where the tensor is
            return torch.empty_like(tensor).copy_(tensor)
        stream = self._stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)  # its memory is not reused before the copy ends
        return host

    # ---------------------------------------------------------------- backward
    def _unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        (pass_id, index), saved = packed
        if saved.device is None:
            self._fetch((pass_id, index))
            self._fetch((pass_id, index - 1))  # prefetch: the next block backward reaches
            if saved.device is None:  # not listed any more (a second backward of a retained graph)
                self._bring_back([saved])
        if saved.ready is not None:
            compute = torch.cuda.current_stream(saved.device.device)
            compute.wait_event(saved.ready)
            saved.device.record_stream(compute)
            saved.ready = None
        return saved.device

    def _fetch(self, key: tuple[int, int]) -> None:
        refs = self._waiting.pop(key, [])
        self._bring_back([s for s in (ref() for ref in refs) if s is not None and s.device is None])

    def _bring_back(self, group: list[_Saved]) -> None:
        if not group:
            return
        device = group[0].home
        if device.type != "cuda":
            for saved in group:
                saved.device = torch.empty_like(saved.host).copy_(saved.host)
            return
        stream = self._stream(device)
        with torch.cuda.stream(stream):
            for saved in group:
                saved.device = saved.host.to(device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        for saved in group:
            saved.ready = ready

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def _new_pass(self) -> None:
        """A new forward starts at block 0: forget blocks whose graph died unused."""
        self._pass += 1
        self._waiting = {key: alive for key, refs in self._waiting.items()
                         if (alive := [ref for ref in refs if ref() is not None])}


def _view_key(tensor: torch.Tensor) -> tuple:
    """Which bytes of which storage at which version a tensor is (its storage object's
    identity is checked as well: PyTorch keeps one Python object per live storage)."""
    return (id(tensor.untyped_storage()), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype, tensor._version)


def from_parameter(tensor: torch.Tensor) -> bool:
    """Whether a saved tensor is a parameter, or a view or cast of one (a leaf that
    requires grad counts as a parameter)."""
    if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
        return True
    node = tensor.grad_fn
    if node is None:
        return tensor.is_leaf and tensor.requires_grad
    for _ in range(4):
        name = type(node).__name__
        if name == "AccumulateGrad":
            return True
        inputs = [n for n, _ in node.next_functions if n is not None]
        if name not in _VIEWS_AND_CASTS or len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def enable_activation_offload(model: nn.Module, blocks) -> ActivationOffloader:
    """Run every block of `blocks` (the model's blocks in forward order:
    techniques/block_stacks.py) under one offloader's hooks; the offloader is kept on the
    model (OFFLOADER_ATTRIBUTE)."""
    if not blocks:
        raise InputError(FLAG, f"{type(model).__name__} has no repeated blocks whose saved tensors could move; "
                               "drop the flag")
    offloader = ActivationOffloader()
    for index, block in enumerate(blocks):
        block.forward = offloader.wrap(index, block.forward)
    object.__setattr__(model, OFFLOADER_ATTRIBUTE, offloader)
    return offloader


def check_activation_offload(plan) -> None:
    """Refuse the combinations activation offload does not support yet."""
    if not plan.activation_offload:
        return
    if plan.is_distributed or plan.classic != "none":
        raise InputError(FLAG, "one process on one device only for now (no --nproc, --dp, --fsdp, --zero, --tp, --pp "
                               "or --classic): the per-rank estimate does not model it yet")
    if plan.compile:
        raise InputError(FLAG, "not with --compile yet (saved-tensor hooks are not compiled); drop one of the two")
