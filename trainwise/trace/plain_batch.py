"""What a fake tensor cannot say, answered as the plain synthetic batch of a trace would.

A fake tensor has shapes and no values, yet model code reads a few values: optimizers their
step counter, loss scalers their overflow flag, models a boolean to branch on ("is there
padding?", "are the labels in range?"), and a few ops size their output by the values
(`masked_select`). The batch a trace runs is a plain synthetic one
(trainwise/models/batch.py, media_batch.py): every token attended, one sequence per row,
finite numbers, labels in range, equal-length transcripts. So:

* "does every element satisfy ...?" (`all`) is answered True;
* "is there any ...?" (`any`: padding, NaN, overflow) False;
* "is the largest element at or above a bound?" (max, then ge/gt) and "is the smallest
  below one?" (min, then lt/le), a label range check, False;
* "is the random draw below the drop rate?" (rand, then lt/le: LayerDrop) False: every
  layer runs, the most memory a step can take;
* a number read (`.item()`) is 1 (step 1; memory never depends on it);
* `masked_select` and `nonzero` (boolean indexing, e.g. Wav2Vec2's time masking) take
  every element: their mask is answered all true, the most memory they can take.

The allocation recorder (recorder.py) asks `PlainBatchAnswers`; the FLOP count, which runs
without the recorder, uses `PlainBatchMode`."""

from __future__ import annotations

import functools
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_EXISTENCE_QUESTIONS = (torch.ops.aten.any,)
_LARGEST = (torch.ops.aten.max, torch.ops.aten.amax)
_SMALLEST = (torch.ops.aten.min, torch.ops.aten.amin)
_ABOVE = (torch.ops.aten.ge, torch.ops.aten.gt)
_BELOW = (torch.ops.aten.le, torch.ops.aten.lt)
_RANDOM_DRAWS = (torch.ops.aten.rand, torch.ops.aten.uniform)
_INDEXING = (torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_,
             torch.ops.aten._index_put_impl_)


# Asked per op overload once, not per op: a packet lookup is a Python property call.
@functools.cache
def _sized_by_values(func) -> bool:
    """Whether PlainBatchAnswers.run may answer `func` itself."""
    return func.overloadpacket in (torch.ops.aten.masked_select, torch.ops.aten.nonzero, *_INDEXING)


@functools.cache
def _questioned(func) -> bool:
    """Whether PlainBatchAnswers.note has anything to remember of `func`'s outputs."""
    return func.overloadpacket in (*_EXISTENCE_QUESTIONS, *_LARGEST, *_SMALLEST, *_ABOVE, *_BELOW, *_RANDOM_DRAWS)


class _IdentitySet:
    """Tensors remembered by identity while they live (a WeakSet compares members with
    ==, which on a fake tensor asks for a value it does not have)."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensors) -> None:
        for tensor in tensors:
            self._refs[id(tensor)] = weakref.ref(tensor)

    def holds(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor


class PlainBatchAnswers:
    """The answers above, for one trace: remembers which booleans are answered False."""

    def __init__(self):
        self._false = _IdentitySet()  # booleans answered False
        self._largest = _IdentitySet()  # outputs of max reductions
        self._smallest = _IdentitySet()  # outputs of min reductions
        self._draws = _IdentitySet()  # outputs of uniform random draws

    def read(self, tensor: torch.Tensor):
        """The value `.item()` of a fake `tensor` returns."""
        if tensor.dtype == torch.bool:
            return not self._false.holds(tensor)
        return 1.0 if tensor.dtype.is_floating_point else 1

    def run(self, func, args, kwargs):
        """`func`'s outputs, with the ops whose size depends on values answered here."""
        if not _sized_by_values(func):  # nearly every op
            return func(*args, **kwargs)
        if func.overloadpacket is torch.ops.aten.masked_select:
            return _all_selected(*args, **kwargs)
        if func.overloadpacket is torch.ops.aten.nonzero:
            return _every_position(*args, **kwargs)
        if func.overloadpacket in _INDEXING and any(_is_mask(index) for index in args[1]):
            return func(args[0], _masks_as_positions(args[1]), *args[2:], **kwargs)
        return func(*args, **kwargs)

    def note(self, func, args, outputs: list[torch.Tensor]) -> None:
        """Remember what `func`'s outputs are, for later reads of them."""
        if not _questioned(func):  # nearly every op
            return
        packet = func.overloadpacket
        if packet in _EXISTENCE_QUESTIONS or self._out_of_range_question(packet, args):
            self._false.add(outputs)
        if packet in _LARGEST:
            self._largest.add(outputs)
        elif packet in _SMALLEST:
            self._smallest.add(outputs)
        elif packet in _RANDOM_DRAWS:
            self._draws.add(outputs)

    def _out_of_range_question(self, packet, args) -> bool:
        if not args or not isinstance(args[0], torch.Tensor):
            return False
        if packet in _ABOVE:
            return self._largest.holds(args[0])
        return packet in _BELOW and (self._smallest.holds(args[0]) or self._draws.holds(args[0]))


class PlainBatchMode(TorchDispatchMode):
    """Enter inside a FakeTensorMode: fake reads and value-sized ops answered as above."""

    def __init__(self):
        super().__init__()
        self.answers = PlainBatchAnswers()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SCALAR_READS:
            return self.answers.read(args[0])
        out = self.answers.run(func, args, kwargs or {})
        self.answers.note(func, args, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def _all_selected(source: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(source.shape, mask.shape)
    return source.new_empty((int(torch.Size(shape).numel()),))


def _every_position(mask: torch.Tensor) -> torch.Tensor:
    return torch.empty((mask.numel(), mask.dim()), dtype=torch.long, device=mask.device)


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _masks_as_positions(indices) -> list:
    """Boolean index masks as the position indices of their (all true) elements, one index
    tensor per dimension a mask covers, as PyTorch turns them into before indexing."""
    positions = []
    for index in indices:
        if _is_mask(index):
            positions.extend(_every_position(index).unbind(1))
        else:
            positions.append(index)
    return positions
