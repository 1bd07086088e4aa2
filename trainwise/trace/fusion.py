"""The work of a compiled region as inductor launches it: fused groups of element-wise ops.

Under `--compile` the trace still runs the eager step (its ops are the ones the compiled
graph is made of), but inside a compiled region inductor does not launch one kernel per
op. Between two matrix products (or attention kernels) a chain of element-wise,
normalisation and transcendental ops becomes one generated kernel that reads what enters
the chain from memory once and writes only what leaves it: what a later op outside the
chain reads, and what autograd keeps for backward. Matmuls and attention stay library
calls, launched one by one by the compiled wrapper; views cost nothing (they are strides
in the generated code). Outside the regions (embeddings, head and loss under
`--compile-scope blocks`, the optimizer always) ops run eager as before.

Which ops are in a region:
* scope "blocks" (engine/compile_regions.py compiles each block's forward): the ops of a
  block's forward, and of its backward (AOTAutograd compiles the backward too, activation
  checkpointing's recomputation inside it), as trainwise/trace/blocks.py marks them;
* scope "model": every op of forward inside the model's modules, and every op of backward.

What is recorded (trainwise/trace/op_costs.py's `OpCosts.compiled`, the same keys as the
eager rows): per op class, the kernels launched (one per fused group, counted under the
class of its first op; one per matmul or attention), the bytes each fused op reads from
outside its group and the bytes its outputs leave the group with (charged when they are
first read outside it or saved for backward, under the producing op's class), and per
phase the calls into compiled regions (op class "region", no bytes), each of which costs
the host a fixed wrapper time. A group ends where a matmul, an attention kernel, an eager
op or another region comes. Tensors are followed by storage (a view reads its base's
producer). This is an approximation of inductor's scheduler: it may split a group at a
reduction it cannot fuse, or fuse across a matmul's epilogue; neither is modelled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from trainwise.trace.block_ids import NO_BLOCK

if TYPE_CHECKING:  # a hint only: the tracker is torch code, the grouping is not
    from trainwise.trace.blocks import BlockTracker

FUSIBLE = ("elementwise", "normalization", "transcendental")
EXTERN = ("matmul", "attention")  # library kernels the compiled wrapper calls one by one
REGION_PHASES = ("forward", "backward")


class CompiledRegions:
    """Which compiled region an op runs in, or None when it runs eager."""

    def __init__(self, scope: str, blocks: BlockTracker | None):
        self.scope = scope
        self.blocks = blocks

    def region(self, phase: str, module: str) -> tuple | None:
        if phase not in REGION_PHASES:
            return None
        if self.scope == "model":
            return (phase, "model") if phase == "backward" or module != "" else None
        block = self.blocks.running if self.blocks is not None else NO_BLOCK
        return (phase, block) if block != NO_BLOCK else None


class FusionGrouper:
    """Groups a compiled region's fusible ops and adds their work to `rows` (a dict of
    op-cost key -> [kernels, FLOPs, bytes read, bytes written]). `key_of(tensor)` is the
    trace's storage key of a tensor (None when it has none)."""

    def __init__(self, rows: dict, key_of: Callable):
        self.rows = rows
        self.key_of = key_of
        self._group = 0  # id of the open fused group, 0 when none
        self._next_group = 1
        self._region = None  # the region of the last op seen (None: eager)
        self._group_read: set = set()  # storages the open group has read already
        # storage key -> (group, producing op's row key, bytes): written by a fused op,
        # not yet charged as leaving its group
        self._pending: dict[int, tuple[int, tuple, int]] = {}

    def op(self, region, row_key: tuple, op_class: str, inputs: list, outputs: list, work: list[int]) -> bool:
        """Account one op; True when it ran in a compiled region (the caller then leaves it
        out of the eager rows). `work` is the op's [1, FLOPs, read, written] as eager."""
        if region != self._region:
            self._close()
            if region is not None:
                self._add((region[0], row_key[1], "region", "none", False, 0), [1, 0, 0, 0])
            self._region = region
        if op_class == "metadata":  # a view reads nothing; in a region it is strides only
            return region is not None
        if region is None or op_class not in FUSIBLE:
            self._close()
        for tensor in inputs:  # what leaves another group is written out by it
            produced = self._pending.get(self.key_of(tensor))
            if produced is not None and produced[0] != self._group:
                self._charge(self.key_of(tensor))
        if region is None:
            return False
        if op_class not in FUSIBLE:
            self._add(row_key, work)
            return True
        if not self._group:
            self._group, self._next_group = self._next_group, self._next_group + 1
            self._add(row_key, [1, 0, 0, 0])
        read = 0
        for tensor in inputs:
            key = self.key_of(tensor)
            if key is None or (key not in self._pending and key not in self._group_read):
                read += _nbytes(tensor)
                if key is not None:
                    self._group_read.add(key)
        self._add(row_key, [0, 0, read, 0])
        for tensor in outputs:
            key = self.key_of(tensor)
            if key is not None:
                self._pending[key] = (self._group, row_key, _nbytes(tensor))
            else:
                self._add(row_key, [0, 0, 0, _nbytes(tensor)])
        return True

    def saved(self, key: int | None) -> None:
        """Autograd keeps this storage for backward: a fused group writes it out."""
        self._charge(key)

    def _charge(self, key: int | None) -> None:
        produced = self._pending.pop(key, None) if key is not None else None
        if produced is not None:
            self._add(produced[1], [0, 0, 0, produced[2]])

    def _close(self) -> None:
        self._group = 0
        self._group_read = set()

    def _add(self, key: tuple, values: list[int]) -> None:
        row = self.rows.get(key)
        if row is None:
            self.rows[key] = list(values)
        else:
            for index, value in enumerate(values):
                row[index] += value


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()
