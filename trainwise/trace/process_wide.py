"""A change to process-wide state that nested contexts share: the outermost one makes it
and undoes it. The tracer needs two (kernel registrations for CUDA's autocast policy, and
CUDA's dropout and attention functions); both must outlive a context nested in them and
be undone exactly once."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable


class SharedPatch:
    def __init__(self, install: Callable[[], object], remove: Callable[[object], None]):
        self._install, self._remove = install, remove
        self._lock = threading.Lock()
        self._depth = 0
        self._handle = None

    @contextlib.contextmanager
    def active(self):
        with self._lock:
            if self._depth == 0:
                self._handle = self._install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._remove(self._handle)
                    self._handle = None
