"""NVML (nvidia-ml-py) for the length of a block, where this machine has it."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def nvml_session() -> Iterator[object | None]:
    """The initialised `pynvml` module inside the block, shut down after it; None when
    there is no NVML to ask (no package, no driver library, no permission)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any of those reasons: nothing to ask
        yield None
        return
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - already shut down, or a driver that refuses
            pass
