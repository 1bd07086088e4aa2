"""Long work that allocates many short-lived objects, without the garbage collector
re-reading again and again the objects that outlive it.

A plan search traces dozens of steps on fake tensors; each makes hundreds of thousands of
Python objects, some in reference cycles, so the cyclic collector runs thousands of times.
Its full collections walk every tracked object: what importing torch, transformers and peft
made (modules, classes, functions, ~370,000 objects when the search starts), which lives
until the process ends, and the large traces the search holds. In the 8B search of
benchmarks/plan_search_time.py, 11 full collections took 1.8 of its 2.4-2.5 CPU seconds of
collection. Here the objects alive when the work starts are frozen (`gc.freeze`: left out
of every collection), and a full collection waits for 100 collections of the middle
generation instead of 10: 8 full collections (those of the imports before the search
included), 0.9 CPU seconds, 1.6 in all (one run each, on a busy machine). The young
generations are collected as before, so short-lived cycles still go at once; and no trace
sees a storage freed at another time: the recorder's frees come from reference counts
(trainwise/trace/recorder.py), not from the collector. Both are undone after, so that a
caller's objects are collectable again."""

from __future__ import annotations

import gc
from contextlib import contextmanager

# Collections of the middle generation between two full ones (Python's default is 10).
FULL_COLLECTION_EVERY = 100


@contextmanager
def frozen_heap():
    """Freeze every object tracked now and make full collections rarer for the duration of
    the block; nested, or inside a caller's own freeze, it changes nothing."""
    if gc.get_freeze_count():  # an outer block, or the caller, froze them already
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
