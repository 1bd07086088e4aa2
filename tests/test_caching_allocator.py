"""The caching allocator model, specified by cases worked out by hand from the allocator's rules."""

import random
import time

import pytest

from trainwise.estimator.caching_allocator import (
    AllocationEvent,
    AllocatorStats,
    CachingAllocatorModel,
    round_block_size,
    segment_size,
    simulate,
)

KiB = 1024
MiB = 1024**2


def test_requests_round_up_to_512_bytes():
    assert round_block_size(1) == 512
    assert round_block_size(512) == 512
    assert round_block_size(513) == 1024


def test_zero_byte_request_takes_no_block():
    assert round_block_size(0) == 0
    stats = simulate([("alloc", "empty", 0), ("free", "empty", 0)])
    assert stats == AllocatorStats(peak_allocated=0, peak_reserved=0, allocated=0,
                                   reserved=0, segments=0)


def test_segment_sizes_follow_request_size():
    assert segment_size(512) == 2 * MiB
    assert segment_size(1 * MiB) == 2 * MiB
    assert segment_size(1 * MiB + 512) == 20 * MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 1) == 12 * MiB


def test_small_request_reserves_a_2_mib_segment():
    stats = simulate([("alloc", "a", 1 * KiB)])
    assert stats.peak_allocated == 1 * KiB
    assert stats.peak_reserved == 2 * MiB
    assert stats.segments == 1


def test_5_mib_request_reserves_a_20_mib_segment():
    stats = simulate([("alloc", "a", 5 * MiB)])
    assert stats.allocated == 5 * MiB
    assert stats.reserved == 20 * MiB


def test_11_mib_request_reserves_12_mib_and_counts_the_unsplit_remainder():
    # The 1 MiB left in the 12 MiB segment is not > 1 MiB, so the block is not split and
    # the whole 12 MiB counts as allocated, as max_memory_allocated() would report.
    stats = simulate([("alloc", "a", 11 * MiB)])
    assert stats.reserved == 12 * MiB
    assert stats.allocated == 12 * MiB


def test_freeing_and_reallocating_the_same_size_reuses_the_segment():
    events = []
    for step in range(10):
        events += [("alloc", f"t{step}", 30 * MiB), ("free", f"t{step}", 0)]
    stats = simulate(events)
    assert stats.peak_reserved == 30 * MiB
    assert stats.segments == 1
    assert stats.allocated == 0


def test_two_5_mib_allocations_share_one_20_mib_segment():
    stats = simulate([("alloc", "a", 5 * MiB), ("alloc", "b", 5 * MiB)])
    assert stats.allocated == 10 * MiB
    assert stats.reserved == 20 * MiB
    assert stats.segments == 1


def test_freed_large_block_is_split_for_a_smaller_request_and_coalesced_on_free():
    model = CachingAllocatorModel()
    model.malloc("big", 12 * MiB)
    model.free("big")
    assert model.cached_free_blocks() == [(12 * MiB, 0)]

    model.malloc("part", 4 * MiB)  # best fit is the 12 MiB block; 8 MiB left > 1 MiB: split
    assert model.allocated == 4 * MiB
    assert model.cached_free_blocks() == [(8 * MiB, 4 * MiB)]
    model.malloc("rest", 8 * MiB)  # exactly the remainder
    assert model.reserved == 12 * MiB

    model.free("part")
    model.free("rest")
    assert model.cached_free_blocks() == [(12 * MiB, 0)]  # one block again
    model.malloc("big-again", 12 * MiB)
    assert model.stats().peak_reserved == 12 * MiB
    assert model.segments == 1


def test_best_fit_prefers_the_smallest_block_then_the_lowest_address():
    model = CachingAllocatorModel()
    for key in ("a", "b", "c"):
        model.malloc(key, 30 * MiB)  # segments at 0, 30 and 60 MiB
    model.malloc("d", 24 * MiB)  # segment at 90 MiB
    for key in ("c", "a", "d"):
        model.free(key)
    model.malloc("x", 22 * MiB)  # the 24 MiB block fits tighter than the 30 MiB ones
    assert model.cached_free_blocks() == [(2 * MiB, 112 * MiB), (30 * MiB, 0), (30 * MiB, 60 * MiB)]
    model.malloc("y", 30 * MiB)  # two 30 MiB blocks tie: the lower address is taken
    assert model.cached_free_blocks() == [(2 * MiB, 112 * MiB), (30 * MiB, 60 * MiB)]
    assert model.reserved == 114 * MiB


def test_small_request_never_takes_a_large_pool_block():
    model = CachingAllocatorModel()
    model.malloc("big", 12 * MiB)
    model.free("big")
    model.malloc("small", 1 * KiB)
    assert model.reserved == 12 * MiB + 2 * MiB
    assert model.cached_free_blocks(small=False) == [(12 * MiB, 0)]


def test_large_request_never_takes_a_small_pool_block():
    model = CachingAllocatorModel()
    model.malloc("small", 1 * MiB)  # small pool, 2 MiB segment
    model.free("small")
    model.malloc("large", 1 * MiB + 512)  # large pool: new 20 MiB segment
    assert model.reserved == 2 * MiB + 20 * MiB


def test_small_pool_splits_down_to_512_bytes():
    model = CachingAllocatorModel()
    model.malloc("a", 1 * MiB)
    model.malloc("b", 1 * MiB - 512)  # leaves 512 B, still worth a block of its own
    assert model.allocated == 2 * MiB - 512
    model.malloc("c", 512)  # fits the last 512 B of the same 2 MiB segment
    assert model.reserved == 2 * MiB
    assert model.allocated == 2 * MiB


def test_large_pool_keeps_remainders_of_1_mib_or_less_attached():
    model = CachingAllocatorModel()
    model.malloc("a", 19 * MiB)  # 20 MiB segment, 1 MiB left: not split
    assert model.allocated == 20 * MiB
    model.free("a")
    model.malloc("b", 18 * MiB)  # 2 MiB left: split
    assert model.allocated == 18 * MiB


def test_fragmentation_grows_reserved_although_allocated_would_fit():
    model = CachingAllocatorModel()
    for key in ("a", "b", "c", "d"):
        model.malloc(key, 5 * MiB)  # four 5 MiB blocks fill one 20 MiB segment
    model.free("a")
    model.free("c")  # 10 MiB free, but as two separate 5 MiB holes
    model.malloc("e", 8 * MiB)
    stats = model.stats()
    assert stats.allocated == 18 * MiB  # would fit in the 20 MiB segment...
    assert stats.reserved == 40 * MiB  # ...but no hole is 8 MiB: a second segment
    assert stats.segments == 2


def test_peaks_outlive_frees():
    stats = simulate([("alloc", "a", 40 * MiB), ("alloc", "b", 40 * MiB),
                      ("free", "a", 0), ("free", "b", 0)])
    assert stats.peak_allocated == 80 * MiB
    assert stats.allocated == 0
    assert stats.peak_reserved == stats.reserved == 80 * MiB


def test_empty_cache_releases_only_whole_free_segments():
    model = CachingAllocatorModel()
    model.malloc("a", 5 * MiB)
    model.malloc("b", 30 * MiB)
    model.free("b")
    model.empty_cache()
    assert model.reserved == 20 * MiB
    assert model.stats().peak_reserved == 50 * MiB


def test_events_accept_named_tuples_and_short_frees():
    stats = simulate([AllocationEvent("alloc", 1, 4 * KiB), ("free", 1)])
    assert stats.peak_allocated == 4 * KiB


def test_misuse_is_reported():
    model = CachingAllocatorModel()
    model.malloc("a", 1)
    with pytest.raises(ValueError):
        model.malloc("a", 1)
    with pytest.raises(KeyError):
        model.free("never-allocated")
    with pytest.raises(ValueError):
        model.simulate([("realloc", "a", 1)])


def test_allocated_and_free_blocks_always_tile_the_reserved_memory():
    rng = random.Random(0)
    model = CachingAllocatorModel()
    live = []
    for step in range(3000):
        if live and rng.random() < 0.45:
            model.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, 2 * MiB),
                               rng.randint(1, 64 * MiB)])
            model.malloc(step, size)
            live.append(step)
        free_bytes = sum(s for s, _ in model.cached_free_blocks(small=True)) + \
            sum(s for s, _ in model.cached_free_blocks(small=False))
        assert model.allocated + free_bytes == model.reserved


def test_50k_events_replay_quickly():
    rng = random.Random(1)
    events, live = [], []
    for step in range(50_000):
        if live and rng.random() < 0.5:
            events.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            size = rng.choice([rng.randint(1, 1 * MiB), rng.randint(1, 256 * MiB)])
            events.append(("alloc", step, size))
            live.append(step)
    start = time.perf_counter()
    stats = simulate(events)
    elapsed = time.perf_counter() - start
    assert stats.peak_reserved >= stats.peak_allocated
    assert elapsed < 10.0  # about 0.1 s in practice; generous so it never flakes
