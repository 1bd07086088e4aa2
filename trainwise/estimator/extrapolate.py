"""Trace a few identical blocks, extrapolate to all of them.

A deep model is traced with 2 and 3 blocks per stack (trainwise/trace/depth.py). The
3-block trace is then repeated into the allocation timeline of the full-depth step
(`synthesize_trace`), and that timeline goes through the same replay and allocator model
as a full trace, so the peak, the phase it falls in and the reserved memory come out as a
full trace's would.

How the timeline is repeated: the tracer tags every event with the block whose work it
was (forward call, backward pass, recomputation) and every storage with the block it
belongs to (outside any block: the block of the storages it was computed from; see
trainwise/trace/blocks.py). Inside each phase the events then come in runs per block:
block 0, 1, 2 in forward and in the optimizer's parameter lists, 2, 1, 0 in backward.
Block 1 is a middle block (a block on each side), so each run of block 1 is written out
for blocks 1 .. N-2 in its place, in the run's direction, and block 2 becomes block N-1.
A storage an event touches is renamed by its place relative to the running block: its
own block's (a copy per block written out), the previous block's (the input it frees)
or the next block's (the gradient of its output). Which storage of a middle neighbour a
middle block touches is read off where the trace has a block with a middle neighbour:
block 2's events on block 1 (the previous one) and block 0's (the next one), in order.
Storages of no block that change with depth are found by comparing the 2- and 3-block
traces (`match_shared`).

The 2-block trace also checks the method on each estimate: the 3-block trace shrunk to 2
blocks must reproduce it event for event; where it does not, the figures fall back to a
line through the 2- and 3-block results (`extrapolate_dataclass`). Blocks that differ by
design are not written out: their figures are read per layer kind (`extrapolate_dataclass`
with the depths trainwise/trace/depth.py `depth_fit` chose).
tests/test_extrapolation.py compares both with full traces."""

from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from typing import NamedTuple

from trainwise.trace.block_ids import NO_BLOCK
from trainwise.trace.depth import TRACED_BLOCKS, DepthFit, extrapolate_by_kind
from trainwise.trace.step_trace_data import StepTrace
from trainwise.trace.storage import ALLOC, StorageRecord


def extrapolate_dataclass(traced: list, fit: DepthFit):
    """Read every int field (and int values of dict fields) of a frozen dataclass at full
    depth from one instance per traced depth (`extrapolate_by_kind`: a line through 2 and
    3 blocks, or per layer kind); other fields are taken from the deepest trace."""
    deepest = traced[-1]
    changes = {}
    for f in dataclasses.fields(deepest):
        value = getattr(deepest, f.name)
        if (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, dict):
            changes[f.name] = extrapolate_by_kind([getattr(t, f.name) for t in traced], fit)
    return dataclasses.replace(deepest, **changes)


# ----------------------------------------------------------------- synthesised timelines
class CannotSynthesize(ValueError):
    """The trace's blocks do not repeat cleanly (the caller falls back to a line)."""


def extrapolated_stacks(small: StepTrace, large: StepTrace) -> set[str]:
    """Stacks with TRACED_BLOCKS[0] blocks in `small` and TRACED_BLOCKS[1] in `large`."""
    def depths(trace):
        return Counter(stack for stack, _ in trace.blocks)
    small_depths, large_depths = depths(small), depths(large)
    return {stack for stack, depth in large_depths.items()
            if depth == TRACED_BLOCKS[1] and small_depths.get(stack) == TRACED_BLOCKS[0]}


def synthesize_trace(trace: StepTrace, stacks: set[str], target_blocks: int,
                     smaller: StepTrace | None = None) -> StepTrace:
    """The timeline of the step with `target_blocks` blocks in each of `stacks`, made from
    `trace`, which has 3 (see the module docstring). Raises CannotSynthesize.

    A few storages outside the blocks depend on depth: some grow (the stacked
    per-parameter norms of gradient clipping), some come one per block (a key/value
    cache's per-layer entries, made in a loop before the blocks run). With the 2-block
    trace `smaller` these are found by comparing it with `trace`: sizes are extrapolated
    on a line, and each storage the 3-block trace has more is repeated in place."""
    synthesis = _Synthesis(trace, stacks, target_blocks)
    if smaller is not None:
        synthesis.match_shared(smaller)
    return synthesis.run()


def same_timeline(a: StepTrace, b: StepTrace) -> bool:
    """Whether two traces allocate and free the same sizes and categories in the same order.

    Frees with no allocation between them count as one set: their order can be that of a
    hash table (autocast's cache of cast weights) and changes no allocator statistic."""
    if (a.window_start, a.phase_starts) != (b.window_start, b.phase_starts) or len(a.events) != len(b.events):
        return False
    return _canonical(a) == _canonical(b)


def _canonical(trace: StepTrace) -> list:
    out, frees = [], []
    for kind, key in trace.events:
        record = trace.records[key]
        signature = (record.nbytes, record.category, record.host_resident)
        if kind == ALLOC:
            out.extend(sorted(frees))
            frees.clear()
            out.append(("alloc", signature))
        else:
            frees.append(("free", signature))
    out.extend(sorted(frees))
    return out


class _Run(NamedTuple):
    start: int
    end: int
    block: int  # NO_BLOCK: events of no block
    before: tuple[int, int]  # events of the block on its neighbours (-1, +1) earlier in the segment


class _Synthesis:
    """One synthesis (see the module docstring). Positions: 0, 1, 2 in the traced stack;
    targets: 0 .. last in the full one (block 0 stays 0, block 2 becomes `last`, block
    1 is written out as 1 .. last-1)."""

    def __init__(self, trace: StepTrace, stacks: set[str], target: int):
        if TRACED_BLOCKS[1] != 3 or not stacks or target < 2:
            raise CannotSynthesize("needs 3 traced blocks per stack and a target of at least 2")
        if len(trace.event_blocks) != len(trace.events):
            raise CannotSynthesize("the trace has no block tags")
        self.trace, self.last, self.stacks = trace, target - 1, stacks
        # block id -> (stack, position), for the stacks being extrapolated
        self.place = {b: where for b, where in enumerate(trace.blocks) if where[0] in stacks}
        self.block_at = {where: b for b, where in self.place.items()}
        self.records: list[StorageRecord] = []
        self._out_key: dict[tuple[int, int | None], int] = {}
        self._sizes: dict[int, int] = {}  # key -> bytes at the target depth, where it differs
        self._per_block: set[int] = set()  # storages of no block that come once per block
        # (segment, block, offset) -> (kind, key) of the block's events on the storages of
        # its neighbour at offset -1 or +1, in order
        self._neighbour_events: dict[tuple[int, int, int], list[tuple[str, int]]] = {}

    def match_shared(self, smaller: StepTrace) -> None:
        """Compare the storages no block owns with those of `smaller` (one block fewer):
        those whose size differs grow on a line; those only the trace has come once per
        block."""
        small_place = {b for b, where in enumerate(smaller.blocks) if where[0] in self.stacks}
        shared = [r for r in self.trace.records if r.owner not in self.place]
        small_shared = [r for r in smaller.records if r.owner not in small_place]
        extra = self.last - 2
        matcher = difflib.SequenceMatcher(None, [_made(r) for r in small_shared], [_made(r) for r in shared],
                                          autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for small, big in zip(small_shared[i1:i2], shared[j1:j2]):
                    if big.nbytes != small.nbytes:
                        self._sizes[big.key] = big.nbytes + (big.nbytes - small.nbytes) * extra
            elif tag == "insert":
                self._per_block.update(r.key for r in shared[j1:j2])
            else:
                raise CannotSynthesize("the traces differ outside the blocks")

    # ------------------------------------------------------------------ the timeline
    def run(self) -> StepTrace:
        trace = self.trace
        records = trace.records
        context = [self._context(b, records[key].owner) for b, (_, key) in zip(trace.event_blocks, trace.events)]
        bounds = sorted({0, trace.window_start, *(start for _, start in trace.phase_starts), len(trace.events)})
        segments = [self._runs(n, context, lo, hi) for n, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]
        events: list[tuple[str, int]] = []
        new_index = {}
        for n, runs in enumerate(segments):
            new_index[bounds[n]] = len(events)
            for i, run in enumerate(runs):
                targets = self._targets(runs, i)
                if targets == [None]:
                    self._write_shared(run, events)
                    continue
                resolved = self._resolved(run)  # once: a middle run is written out for every middle block
                for target in targets:
                    self._write(n, run, target, resolved, events)
        new_index[len(trace.events)] = len(events)
        _check_balanced(events)
        return dataclasses.replace(
            trace, events=events, records=self.records, window_start=new_index[trace.window_start],
            phase_starts=[(name, new_index[start]) for name, start in trace.phase_starts],
            event_blocks=[], blocks=[])

    def _context(self, event_block: int, owner: int) -> int:
        """The block an event belongs to: the one running, else the storage's own."""
        if event_block in self.place:
            return event_block
        return owner if owner in self.place else NO_BLOCK

    def _runs(self, segment: int, context: list[int], lo: int, hi: int) -> list[_Run]:
        """The maximal runs of one block in context[lo:hi], noting the events on neighbours."""
        runs, start = [], lo
        events, records = self.trace.events, self.trace.records
        for i in range(lo + 1, hi + 1):
            if i == hi or context[i] != context[start]:
                block = context[start]
                lists = [self._neighbour_events.setdefault((segment, block, offset), []) for offset in (-1, 1)]
                runs.append(_Run(start, i, block, (len(lists[0]), len(lists[1]))))
                if block != NO_BLOCK:
                    stack, position = self.place[block]
                    for kind, key in events[start:i]:
                        where = self.place.get(records[key].owner)
                        if where is not None and where[0] == stack and abs(where[1] - position) == 1:
                            lists[where[1] > position].append((kind, key))
                start = i
        return runs

    def _targets(self, runs: list[_Run], i: int) -> list[int | None]:
        """Positions in the full stack that run `i`'s events are written out for."""
        block = runs[i].block
        if block == NO_BLOCK:
            return [None]
        stack, position = self.place[block]
        if position != 1:
            return [self._home(position)]
        middle = list(range(1, self.last))
        return middle[::-1] if self._descending(runs, i, stack) else middle

    def _descending(self, runs: list[_Run], i: int, stack: str) -> bool:
        """Whether the nearest runs of the same stack around run `i` go 2 before, 0 after."""
        votes = 0
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(runs):
                b = runs[j].block
                if b != NO_BLOCK and self.place[b][0] == stack and self.place[b][1] != 1:
                    votes += 1 if (self.place[b][1] == 2) == (step < 0) else -1
                    break
                j += step
        return votes > 0

    def _home(self, position: int) -> int | None:
        """Where the traced block at `position` goes in the full stack (block 1 is gone
        when the target has only 2 blocks)."""
        if position == 2:
            return self.last
        return position if position < self.last else None

    # ------------------------------------------------------------------ the storages
    def _write_shared(self, run: _Run, events: list) -> None:
        """Append the events of a run of no block (the same at every depth)."""
        for kind, key in self.trace.events[run.start:run.end]:
            if key in self._per_block:  # one in the 3-block trace for each block past 2
                events.extend((kind, self._output(key, -n)) for n in range(self.last - 1))
            else:
                events.append((kind, self._output(key, None)))

    def _resolved(self, run: _Run) -> list[tuple[str, int, int | None, int]]:
        """Run's events as (kind, key, offset, nth): offset None for a storage that is the
        same at any depth, 0 for the running block's own, -1 / +1 for a neighbour's (`nth`:
        the how-manieth such event of the run). None of it depends on the target."""
        stack, position = self.place[run.block]
        seen = Counter()  # events touching the previous / next block's storages so far
        resolved = []
        for kind, key in self.trace.events[run.start:run.end]:
            where = self.place.get(self.trace.records[key].owner)
            if where is None and key in self._per_block:
                raise CannotSynthesize("a block's work touches a per-block storage of no block")
            offset = None if where is None else where[1] - position
            if where is not None and (where[0] != stack or abs(offset) > 1):
                # Not relative to the running block: the same storage whatever the depth.
                if self._home(where[1]) is None:
                    raise CannotSynthesize(f"block {where[1]} of {stack} is gone at this depth")
                offset = None
            resolved.append((kind, key, offset, run.before[offset > 0] + seen[offset] if offset else 0))
            if offset:
                seen[offset] += 1
        return resolved

    def _write(self, segment: int, run: _Run, target: int, resolved: list, events: list) -> None:
        """Append run's `resolved` events as block `target` of the full stack writes them."""
        own = None if target == self._home(self.place[run.block][1]) else target
        for kind, key, offset, nth in resolved:
            if offset:  # a neighbour's storage
                events.append((kind, self._neighbour(segment, run, target, offset, nth, kind, key)))
            else:
                events.append((kind, self._output(key, None if offset is None else own)))

    def _neighbour(self, segment: int, run: _Run, target: int, offset: int, nth: int, kind: str, key: int) -> int:
        """Output key of the storage of the block next to `target` (offset -1: the one
        before, +1: the one after) that the `nth` such event of `run` touches.

        The traced run touched the storage of its own neighbour, which may stand in a
        different place (the first, a middle or the last block) from the neighbour of
        `target`. A middle block that precedes is block 1 as block 2 sees it; one that
        follows is block 1 as block 0 sees it; the first and the last are block 0 and
        block 2 as block 1 sees them."""
        stack, position = self.place[run.block]
        neighbour = target + offset
        if neighbour == 0 or neighbour == self.last:
            seen_from = 1  # the first or last block, as the middle block sees it
        else:
            seen_from = 2 if offset < 0 else 0  # a middle block, from the block after / before it
        if seen_from == position:
            source = key
        else:
            source = self._reference(segment, run, self.block_at[(stack, seen_from)], offset, nth, kind, key)
        return self._output(source, None if neighbour in (0, 1, self.last) else neighbour)

    def _reference(self, segment: int, run: _Run, block: int, offset: int, nth: int, kind: str, key: int) -> int:
        """The storage `block` touches in its `nth` event on its neighbour at `offset` in
        the segment; it must look the same as `key`."""
        events = self._neighbour_events.get((segment, block, offset), ())
        if nth >= len(events):
            raise CannotSynthesize("blocks differ in what they touch of their neighbours")
        other_kind, source = events[nth]
        a, b = self.trace.records[source], self.trace.records[key]
        if other_kind != kind or (a.nbytes, a.category) != (b.nbytes, b.category):
            raise CannotSynthesize("blocks differ in what they touch of their neighbours")
        return source

    def _output(self, key: int, copy: int | None) -> int:
        """Key in the synthesised trace of storage `key` (for `copy` > 0: of its copy in
        block `copy` of the stack; <= 0: of a per-block storage of no block), numbered in
        order of first use."""
        out = self._out_key.get((key, copy))
        if out is None:
            out = self._out_key[(key, copy)] = len(self.records)
            record = self.trace.records[key]
            module, nbytes = record.module, self._sizes.get(key, record.nbytes)
            if copy is not None and copy > 0:
                stack, position = self.place[record.owner]
                prefix = f"{stack}.{position}"
                if module == prefix or module.startswith(prefix + "."):
                    module = f"{stack}.{copy}{module[len(prefix):]}"
            self.records.append(StorageRecord(out, nbytes, record.phase, module, record.op, record.saved_in,
                                              record.category, host_resident=record.host_resident))
        return out


def _made(record: StorageRecord) -> tuple:
    return record.phase, record.module, record.op, record.category


def _check_balanced(events: list[tuple[str, int]]) -> None:
    """Every free follows its allocation, and nothing is allocated twice at once."""
    live = set()
    for kind, key in events:
        if kind == ALLOC:
            if key in live:
                raise CannotSynthesize(f"storage {key} allocated twice")
            live.add(key)
        elif key in live:
            live.remove(key)
        else:
            raise CannotSynthesize(f"storage {key} freed before it was allocated")
