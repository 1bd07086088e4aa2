"""Long work that allocates many short-lived objects, without the garbage collector
re-reading every object the imports made.

A plan search traces dozens of steps on fake tensors; each makes hundreds of thousands of
Python objects, some in reference cycles, so the cyclic collector runs thousands of times.
Its full collections walk every tracked object, and most of them are what importing torch,
transformers and peft made (modules, classes, functions), which live until the process
ends: an 8B search on one H100 spent about 1.8 CPU seconds in 11 full collections. Frozen
(`gc.freeze`), those objects are left out of every collection; the objects the work makes
are collected as before, so no trace sees a storage freed at another time (the recorder's
frees come from reference counts, trainwise/trace/recorder.py). They are unfrozen after,
so that a caller's own objects are collectable again."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def frozen_heap():
    """Freeze every object tracked now for the duration of the block (none already frozen
    by someone else is unfrozen at the end)."""
    if gc.get_freeze_count():  # an outer block, or the caller, froze them already
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
