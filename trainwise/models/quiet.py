"""Keeping transformers' own warnings off trainwise's output where trainwise speaks for
itself: a refusal is one line, and a bench table is not interleaved with model-code
warnings."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at error level and Python warnings ignored, inside the block."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
