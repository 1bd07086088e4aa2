"""Record every storage allocation and free of a traced step, with phase and module."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainwise.trace.module_scope import ModuleScope

ALLOC, FREE = "alloc", "free"


@dataclass
class StorageRecord:
    """One storage the step created. `category` is settled after the step (see StepTrace)."""

    key: int
    nbytes: int
    phase: str
    module: str
    op: str
    saved_in: set[str] = field(default_factory=set)  # phases in which autograd saved it
    category: str = "temporary"


class AllocationRecorder(TorchDispatchMode):
    """A dispatch mode that sees every op's outputs and turns new storages into alloc events;
    a weak reference on each storage turns its death into a free event. Autograd's
    saved-tensor hook marks storages kept for backward."""

    def __init__(self, scope: ModuleScope):
        super().__init__()
        self.scope = scope
        self.phase = "setup"
        self.events: list[tuple[str, int]] = []  # (ALLOC|FREE, storage key), program order
        self.records: list[StorageRecord] = []
        self._live: dict[int, int] = {}  # id(storage object) -> key
        self._weakrefs: dict[int, weakref.ref] = {}
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._on_save, _identity)
        self._existence_answers: weakref.WeakSet = weakref.WeakSet()

    def bool_read_answer(self, tensor: torch.Tensor) -> bool:
        """A fake boolean has no value, but model code branches on some. The batch a trace
        runs is a plain synthetic one (every token attended, one sequence per row, finite
        numbers), so "does every element satisfy ...?" (`all`) is answered True and "is
        there any ...?" (`any`: padding, NaN, overflow) False, as a real step would see."""
        return tensor not in self._existence_answers

    # -------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _SCALAR_READS:
            if args[0].dtype == torch.bool:
                return self.bool_read_answer(args[0])
            return _stand_in_scalar(args[0].dtype)
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _EXISTENCE_QUESTIONS:
            self._existence_answers.update(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.track(tensor, op=func.__name__)
        return out

    def __enter__(self):
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)

    # -------------------------------------------------------------- storages
    def track(self, tensor: torch.Tensor, op: str = "") -> int | None:
        """Key of the tensor's storage, recording an allocation if it is new."""
        storage = tensor.untyped_storage()
        sid = id(storage)
        key = self._live.get(sid)
        nbytes = storage.nbytes()
        if key is not None:
            if nbytes != self.records[key].nbytes:  # resized in place (resize_, set_)
                self.events.append((FREE, key))
                self.records[key].nbytes = nbytes
                self.events.append((ALLOC, key))
            return key
        if nbytes == 0:
            return None
        key = len(self.records)
        self.records.append(StorageRecord(key, nbytes, self.phase, self.scope.current, op))
        self._live[sid] = key
        self._weakrefs[key] = weakref.ref(storage, partial(self._on_free, sid, key))
        self.events.append((ALLOC, key))
        return key

    def key_of(self, tensor: torch.Tensor) -> int | None:
        return self._live.get(id(tensor.untyped_storage()))

    def _on_free(self, sid: int, key: int, _ref) -> None:
        if self._live.get(sid) == key:
            del self._live[sid]
        self._weakrefs.pop(key, None)
        self.events.append((FREE, key))

    def _on_save(self, tensor: torch.Tensor):
        key = self.track(tensor, op="saved")
        if key is not None:
            self.records[key].saved_in.add(self.phase)
        return tensor


_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_EXISTENCE_QUESTIONS = (torch.ops.aten.any,)


def _stand_in_scalar(dtype: torch.dtype):
    """A fake tensor has no value, yet optimizers read their step counter and loss scalers
    their overflow flag with .item(). Memory never depends on those values, so a stand-in
    (step 1) lets the step run on. Booleans: see AllocationRecorder.bool_read_answer."""
    return 1.0 if dtype.is_floating_point else 1


def _identity(x):
    return x
