"""A model of PyTorch's CUDA caching allocator: what allocated and reserved memory become.

Given the allocations and frees of a training step in program order, this replays the
allocator's bookkeeping and reports what `torch.cuda.max_memory_allocated()` and
`torch.cuda.max_memory_reserved()` would say.

The rules are those of c10/cuda/CUDACachingAllocator.cpp in torch 2.x with the default
configuration (no PYTORCH_CUDA_ALLOC_CONF):

* every request is rounded up to a multiple of 512 bytes (kMinBlockSize); a request of
  0 bytes allocates nothing;
* rounded requests of at most 1 MiB (kSmallSize) use the small pool, larger ones the
  large pool; a pool never serves the other pool's requests;
* a request is served by the smallest free block of its pool that fits, ties broken by
  the lower address (best fit);
* with no fitting block, a new segment is cudaMalloc'd: 2 MiB for small requests,
  20 MiB for large requests under 10 MiB, otherwise the request rounded up to 2 MiB;
* the block handed out is split when the remainder is worth keeping: at least 512 bytes
  in the small pool, more than 1 MiB in the large pool. An unsplit block is handed out
  whole, and the allocated statistic counts its whole size (11 MiB asks for a 12 MiB
  segment and reports 12 MiB allocated);
* on free, a block merges with free neighbours of the same segment and goes back to
  its pool; segments are never returned to CUDA.

Not modelled (each is off by default or absent from a single-stream training step):
* memory pressure: when cudaMalloc fails the real allocator frees cached, unsplit
  segments and retries before raising OOM. Here segments are kept, so near the device
  limit our reserved figure is an upper bound on what the real allocator would hold;
* expandable_segments, max_split_size_mb, roundup_power2_divisions,
  garbage_collection_threshold (all off by default);
* multiple streams (blocks are only reused on their own stream) and record_stream
  deferral; CUDA graph private pools; per-process memory fraction.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable, Iterable, NamedTuple, Sequence

MiB = 1024**2

# Constants of c10's caching allocator (c10/core/AllocatorConfig.h in torch 2.13).
MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to this
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request of the small pool
SMALL_SEGMENT = 2 * MiB  # kSmallBuffer: segment size for small requests
LARGE_SEGMENT = 20 * MiB  # kLargeBuffer: segment size for large requests < 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here segments fit the request
ROUND_LARGE = 2 * MiB  # kRoundLarge: rounding of those segments


def round_block_size(nbytes: int) -> int:
    """Bytes of the block a request of `nbytes` occupies (512-byte multiple; 0 for 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def segment_size(block_bytes: int) -> int:
    """Bytes cudaMalloc'd for a new segment serving a rounded request of `block_bytes`."""
    if block_bytes <= SMALL_SIZE:
        return SMALL_SEGMENT
    if block_bytes < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-block_bytes // ROUND_LARGE) * ROUND_LARGE


class AllocationEvent(NamedTuple):
    """One allocator call: kind "alloc" or "free", the block's key, bytes requested.

    `nbytes` is ignored for frees (the block remembers its size).
    """

    kind: str
    key: Hashable
    nbytes: int = 0


@dataclass(frozen=True)
class AllocatorStats:
    """Allocator statistics in bytes, named as torch.cuda reports them."""

    peak_allocated: int  # torch.cuda.max_memory_allocated()
    peak_reserved: int  # torch.cuda.max_memory_reserved()
    allocated: int  # torch.cuda.memory_allocated() at the end
    reserved: int  # torch.cuda.memory_reserved() at the end
    segments: int  # cudaMalloc'd segments held at the end


class _Block:
    """A contiguous range of one segment, free or allocated."""

    __slots__ = ("address", "size", "small", "allocated", "prev", "next")

    def __init__(self, address: int, size: int, small: bool):
        self.address = address
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _FreePool:
    """Free blocks of one pool, ordered by (size, address) for best-fit search."""

    def __init__(self):
        self._order: list[tuple[int, int]] = []
        self._blocks: dict[int, _Block] = {}

    def add(self, block: _Block) -> None:
        bisect.insort(self._order, (block.size, block.address))
        self._blocks[block.address] = block

    def remove(self, block: _Block) -> None:
        i = bisect.bisect_left(self._order, (block.size, block.address))
        del self._order[i]
        del self._blocks[block.address]

    def take_best_fit(self, size: int) -> _Block | None:
        """Remove and return the smallest free block of at least `size` bytes."""
        i = bisect.bisect_left(self._order, (size, -1))
        if i == len(self._order):
            return None
        _, address = self._order.pop(i)
        return self._blocks.pop(address)

    def sizes(self) -> list[tuple[int, int]]:
        return list(self._order)

    def blocks(self) -> list[_Block]:
        return list(self._blocks.values())


class CachingAllocatorModel:
    """Replays allocations and frees the way PyTorch's CUDA caching allocator serves them.

    Keys name live blocks (any hashable: a tensor id, a storage name); a key can be
    allocated again after it is freed.
    """

    def __init__(self):
        self._small = _FreePool()
        self._large = _FreePool()
        self._live: dict[Hashable, _Block | None] = {}
        self._next_address = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0

    def malloc(self, key: Hashable, nbytes: int) -> int:
        """Allocate `nbytes` under `key`; returns the bytes counted as allocated."""
        if key in self._live:
            raise ValueError(f"allocation {key!r} is already live")
        size = round_block_size(nbytes)
        if size == 0:
            self._live[key] = None  # torch hands out a null pointer, no block
            return 0
        small = size <= SMALL_SIZE
        pool = self._small if small else self._large
        block = pool.take_best_fit(size)
        if block is None:
            block = self._new_segment(size, small)
        if self._worth_splitting(block, size):
            self._split(block, size, pool)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block.size

    def free(self, key: Hashable) -> None:
        """Free the allocation `key`; its block merges with free neighbours."""
        try:
            block = self._live.pop(key)
        except KeyError:
            raise KeyError(f"free of {key!r}, which is not allocated") from None
        if block is None:
            return
        self.allocated -= block.size
        block.allocated = False
        pool = self._small if block.small else self._large
        before, after = block.prev, block.next
        if before is not None and not before.allocated:
            pool.remove(before)
            block.address = before.address
            block.size += before.size
            block.prev = before.prev
            if block.prev is not None:
                block.prev.next = block
        if after is not None and not after.allocated:
            pool.remove(after)
            block.size += after.size
            block.next = after.next
            if block.next is not None:
                block.next.prev = block
        pool.add(block)

    def empty_cache(self) -> None:
        """Release free, unsplit segments, like torch.cuda.empty_cache()."""
        for pool in (self._small, self._large):
            for block in pool.blocks():
                if block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved -= block.size
                    self.segments -= 1

    def is_live(self, key: Hashable) -> bool:
        return key in self._live

    def cached_free_blocks(self, small: bool = False) -> list[tuple[int, int]]:
        """(size, address) of the free blocks of the small or large pool, best fit first."""
        return (self._small if small else self._large).sizes()

    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            peak_allocated=self.peak_allocated,
            peak_reserved=self.peak_reserved,
            allocated=self.allocated,
            reserved=self.reserved,
            segments=self.segments,
        )

    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = segment_size(size)
        block = _Block(self._next_address, nbytes, small)
        # Fresh segments get increasing addresses; only the ordering of ties matters.
        self._next_address += nbytes
        self.reserved += nbytes
        self.segments += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        return block

    @staticmethod
    def _worth_splitting(block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= MIN_BLOCK_SIZE
        return remaining > SMALL_SIZE

    @staticmethod
    def _split(block: _Block, size: int, pool: _FreePool) -> None:
        # The request takes the front of the block; the rest stays free behind it.
        rest = _Block(block.address + size, block.size - size, block.small)
        rest.prev = block
        rest.next = block.next
        if rest.next is not None:
            rest.next.prev = rest
        block.next = rest
        block.size = size
        pool.add(rest)

    def simulate(self, events: Iterable[Sequence]) -> AllocatorStats:
        """Replay `events` (kind, key, nbytes) on this allocator; returns the stats after.

        A free may also be given as just (kind, key).
        """
        for event in events:
            kind, key = event[0], event[1]
            if kind == "alloc":
                self.malloc(key, event[2])
            elif kind == "free":
                self.free(key)
            else:
                raise ValueError(f"event kind must be 'alloc' or 'free', not {kind!r}")
        return self.stats()


def simulate(events: Iterable[Sequence]) -> AllocatorStats:
    """Replay `events` on a fresh allocator (empty cache) and return its statistics."""
    return CachingAllocatorModel().simulate(events)
