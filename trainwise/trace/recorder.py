"""Record every storage allocation and free of a traced step, with phase and module."""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainwise.trace.block_ids import NO_BLOCK
from trainwise.trace.blocks import BlockTracker
from trainwise.trace.module_scope import ModuleScope
from trainwise.trace.op_costs import op_tensors
from trainwise.trace.plain_batch import SCALAR_READS, PlainBatchAnswers
from trainwise.trace.storage import ALLOC, FREE, StorageRecord

# `tensor.device` of a fake tensor, dispatched as an op: it makes no storage and answers no
# question about values (plain_batch.py), so it only counts as the metadata op it is.
DEVICE_QUERY = torch.ops.prim.device.default


class AllocationRecorder(TorchDispatchMode):
    """A dispatch mode that sees every op's outputs and turns new storages into alloc events;
    a weak reference on each storage turns its death into a free event. Autograd's
    saved-tensor hook marks storages kept for backward.

    Each event also notes the repeated block whose work it was (`event_blocks`, see
    BlockTracker.context), and each storage the block it belongs to (`owner`): the block
    whose work made it or, outside any block's work (optimizer, the model's head), the
    one block of the storages it was computed from."""

    def __init__(self, scope: ModuleScope, blocks: BlockTracker | None = None):
        super().__init__()
        self.scope = scope
        self.blocks = blocks
        self.phase = "setup"
        self.events: list[tuple[str, int]] = []  # (ALLOC|FREE, storage key), program order
        self.event_blocks: list[int] = []  # block whose work each event was, or NO_BLOCK
        self.records: list[StorageRecord] = []
        self._live: dict[int, int] = {}  # id(storage object) -> key
        self._weakrefs: dict[int, weakref.ref] = {}
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._on_save, _identity)
        self.answers = PlainBatchAnswers()  # what fake tensors cannot say (plain_batch.py)
        self._recording = False
        self.costs = None  # an OpCostRecorder (op_costs.py), fed every op after setup
        # op -> fix(outputs, *args, **kwargs): outputs as the target device's kernel returns
        # them where the fake kernel differs (trainwise/trace/layer_norm_stats.py)
        self.output_fixes: dict = {}

    # -------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is DEVICE_QUERY:  # most ops of a step (autograd's engine asks for every gradient)
            out = _fake_device(args[0]) or func(*args, **(kwargs or {}))
            if self.costs is not None and self.phase != "setup":
                self.costs.record_query(args[0], self.phase, self.scope.current)
            return out
        if func in SCALAR_READS:
            return self.answers.read(args[0])
        out = self.answers.run(func, args, kwargs or {})
        fix = self.output_fixes.get(func)
        if fix is not None:
            out = fix(out, *args, **(kwargs or {}))
        # Most ops return one tensor: pytree's flattening only for the others.
        outputs = [out] if isinstance(out, torch.Tensor) else [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.answers.note(func, args, outputs)
        block = self._current_block()
        if block == NO_BLOCK and self.phase in _OWNED_BY_INPUTS and outputs:
            owners = self._owners_from_inputs(func, args, kwargs, outputs)
            for tensor, owner in zip(outputs, owners):
                self.track(tensor, op=func.__name__, owner=owner)
        else:
            for tensor in outputs:
                self.track(tensor, op=func.__name__, owner=block)
        if self.costs is not None and self.phase != "setup":  # after tracking: fusion follows storages
            self.costs.record(func, args, kwargs, out, outputs, self.phase, self.scope.current)
        return out

    def __enter__(self):
        self._recording = True
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        # The model and optimizer die after the trace: their frees are not part of the step.
        self._recording = False

    # -------------------------------------------------------------- storages
    def track(self, tensor: torch.Tensor, op: str = "", owner: int | None = None) -> int | None:
        """Key of the tensor's storage, recording an allocation if it is new (owned by
        `owner`, by default the block whose work is being done)."""
        storage = tensor.untyped_storage()
        sid = id(storage)
        key = self._live.get(sid)
        nbytes = storage.nbytes()
        if key is not None:
            if nbytes != self.records[key].nbytes:  # resized in place (resize_, set_)
                self._event(FREE, key)
                self.records[key].nbytes = nbytes
                self._event(ALLOC, key)
            return key
        if nbytes == 0:
            return None
        key = len(self.records)
        owner = self._current_block() if owner is None else owner
        self.records.append(StorageRecord(key, nbytes, self.phase, self.scope.current, op, owner=owner))
        self._live[sid] = key
        self._weakrefs[key] = weakref.ref(storage, partial(self._on_free, sid, key))
        self._event(ALLOC, key)
        return key

    def key_of(self, tensor: torch.Tensor) -> int | None:
        return self._live.get(id(tensor.untyped_storage()))

    def set_owners(self, tensors_and_blocks) -> None:
        """Say which block already-tracked storages belong to (parameters are created
        before any block runs), from (tensor, block) pairs. A storage claimed by two
        blocks (a weight shared between layers) belongs to none."""
        claims: dict[int, set[int]] = {}
        for tensor, block in tensors_and_blocks:
            key = self.key_of(tensor)
            if key is not None:
                claims.setdefault(key, set()).add(block)
        for key, blocks in claims.items():
            self.records[key].owner = blocks.pop() if len(blocks) == 1 else NO_BLOCK

    def _current_block(self) -> int:
        return self.blocks.context if self.blocks is not None else NO_BLOCK

    def _event(self, kind: str, key: int) -> None:
        self.events.append((kind, key))
        self.event_blocks.append(self._current_block())

    def _owner_of(self, tensor) -> int:
        key = self._live.get(id(tensor.untyped_storage())) if isinstance(tensor, torch.Tensor) else None
        return NO_BLOCK if key is None else self.records[key].owner

    def _owners_from_inputs(self, func, args, kwargs, outputs) -> list[int]:
        """Owners of an op's new outputs outside any block: a multi-tensor (foreach) op's
        i-th output belongs with its i-th input; any other op's outputs with the one block
        its inputs belong to, if they belong to one."""
        first = args[0] if args else None
        if func.__name__.startswith("_foreach_") and isinstance(first, (list, tuple)) and len(first) == len(outputs):
            return [self._owner_of(t) for t in first]
        owners = {self._owner_of(t) for t in op_tensors(args, kwargs)}
        owners.discard(NO_BLOCK)
        owner = owners.pop() if len(owners) == 1 else NO_BLOCK
        return [owner] * len(outputs)

    def _on_free(self, sid: int, key: int, _ref) -> None:
        if self._live.get(sid) == key:
            del self._live[sid]
        self._weakrefs.pop(key, None)
        if self._recording:
            self._event(FREE, key)

    def _on_save(self, tensor: torch.Tensor):
        self.mark_saved(tensor)
        return tensor

    def mark_saved(self, tensor: torch.Tensor) -> None:
        """Note `tensor`'s storage as kept for backward in this phase (autograd's hook, and
        the outputs selective checkpointing keeps: trainwise/techniques/selective_checkpoint.py)."""
        key = self.track(tensor, op="saved")
        if key is not None:
            self.records[key].saved_in.add(self.phase)
            if self.costs is not None:
                self.costs.saved(key)


# Phases in which a new storage made outside any block's work belongs to the block of the
# storages it was computed from (optimizer state and temporaries; the model's head, on the
# last block's output). Not "data": the batch belongs to no block.
_OWNED_BY_INPUTS = ("setup", "forward", "backward", "optimizer", "zero_grad")


def _identity(x):
    return x


def _fake_device(tensor) -> torch.device | None:
    """The device a fake tensor says it is on, as the fake mode answers `tensor.device`
    (its handler for prim.device) without a trip through the mode; None for other tensors."""
    if isinstance(tensor, FakeTensor) and not tensor.fake_mode.in_kernel_invocation:
        return tensor.fake_device
    return None
