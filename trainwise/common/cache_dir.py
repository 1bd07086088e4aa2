"""The per-user trainwise cache: $TRAINWISE_CACHE, else $XDG_CACHE_HOME/trainwise, else
~/.cache/trainwise. Device profiles (profiles/), compiled graphs (compile/), tokenized
corpora (tokens/) and traced steps (traces/) each have a folder in it."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    root = os.environ.get("TRAINWISE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainwise"
    return Path(root)
