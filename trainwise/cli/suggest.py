""""did you mean": the closest known spelling of what a user typed (flags here; model and
GPU names use the same difflib rule where they are resolved)."""

from __future__ import annotations

import argparse
import difflib

# difflib's ratio: 2 x matching characters / total characters. 0.6 keeps one or two typos
# in a flag name (--seqlen -> --seq-len is 0.93) and drops unrelated words.
CUTOFF = 0.6


def closest(typed: str, known, cutoff: float = CUTOFF) -> str | None:
    """The known spelling most like `typed`, or None when none is close."""
    found = difflib.get_close_matches(typed, list(known), n=1, cutoff=cutoff)
    return found[0] if found else None


def unknown_flags_message(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """"unknown flag --seqlen (did you mean --seq-len?)" for the flags among `extras` (the
    arguments argparse did not recognise), against the flags `parser` knows."""
    flags = [token.split("=", 1)[0] for token in extras if token.startswith("-")]
    if not flags:
        return f"unexpected arguments: {' '.join(extras)}"
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    parts = []
    for flag in flags:
        match = closest(flag, known)
        parts.append(f"{flag} (did you mean {match}?)" if match else flag)
    noun = "flag" if len(parts) == 1 else "flags"
    return f"unknown {noun} {', '.join(parts)}; see --help"
