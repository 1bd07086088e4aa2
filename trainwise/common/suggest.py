""""did you mean": the closest known spelling of what a user typed (flags, model names,
GPU names), by difflib's similarity."""

from __future__ import annotations

import difflib

# difflib's ratio: 2 x matching characters / total characters. 0.6 keeps one or two typos
# (--seqlen -> --seq-len is 0.93, H10 -> H100 0.86) and drops unrelated words.
CUTOFF = 0.6


def closest(typed: str, known, cutoff: float = CUTOFF) -> str | None:
    """The known spelling most like `typed` (ignoring case), or None when none is close."""
    by_lower = {name.lower(): name for name in known}
    found = difflib.get_close_matches(typed.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None
